"""A picture of a detector's predictions on the first validation images, readable at a glance.

``draw_predictions`` runs the model on the first ``n`` images of a data set and ``plot_detections``
draws them, one tile per image in a grid of up to three columns, each image magnified ``SCALE``
times (a 64-96 px image becomes 256-384 px, pixels kept sharp), or less so that the longest side
stays within ``TILE_PX`` (a COCO image of 800 px is drawn at 0.48x, not 3,200 px wide):

* true boxes: green, dashed, with their class name above the box;
* predictions with a score of at least ``score`` (``task.vis_score``): red, solid, with class and
  score below the box, so that no label covers the object it names (the axes have margins above
  and below the image for the labels of boxes at an edge);
* at most ``MAX_SHOWN`` predictions per image, best first, one per box (a sigmoid head scores
  every class of a query: the same box K times); the tile's title gives how many passed;
* when no prediction of an image reaches ``score``, its ``TOP_K`` best are drawn instead (orange,
  dotted), and the tile's title says so: a model early in training is not shown as empty; when the
  best predictions coincide (fewer than ``TOP_K`` distinct boxes), the title says how many boxes were
  drawn and that all the predictions lie on them;
* a label that would overlap another of its tile moves a line further from its box (below stays
  below, above stays above), so the labels of close boxes stack instead of covering each other;
* the title gives the threshold and the counts, the legend says which colour is which.
"""
from __future__ import annotations

import io
import math
from pathlib import Path

import torch
from torchvision.ops import box_convert

from vispe.models.detr.heads.postprocess import postprocess

SCALE = 4.0  # magnification of small images
TILE_PX = 384  # longest side of a tile's image in the picture, at most (large images are shrunk to it)
TOP_K = 3  # predictions drawn for an image none of whose predictions reaches the threshold
MAX_SHOWN = 10  # predictions drawn at most per image (the best)
MAX_SHIFTS = 8  # times a label moves a line away from its box to clear the tile's other labels
LABEL_PAD_PX = 1.5  # the label's coloured pad around its text (1 point at DPI 100), in pixels
COLOURS = {"truth": "#00b000", "prediction": "#e00000", "top-k": "#ff8c00"}
STYLES = {"truth": "--", "prediction": "-", "top-k": ":"}
DPI = 100


@torch.no_grad()
def draw_predictions(model, dataset, path: str | Path, *, device, collate_fn, info, n: int = 6,
                     score: float = 0.5, title: str | None = None) -> list[dict]:
    """Run ``model`` on ``dataset[0:n]`` and write the picture to ``path`` (PNG, atomically).

    Returns what was drawn (``plot_detections``); the title defaults to the file's stem (the epoch).
    """
    n = min(n, len(dataset))
    if n == 0:
        return []
    images, mask, targets = collate_fn([dataset[i] for i in range(n)])
    was_training = model.training
    model.eval()
    out = model(images.to(device), mask.to(device))
    model.train(was_training)
    sizes = torch.stack([t["size"] for t in targets])  # (n, 2) (h, w) of each valid area
    mean = torch.tensor(info.mean)[:, None, None]
    std = torch.tensor(info.std)[:, None, None]
    names = info.category_names
    tiles = []
    for img, t, det, (h, w) in zip(images, targets, postprocess(out, sizes), sizes.tolist()):
        pixels = ((img[:, :h, :w].cpu() * std + mean).clamp(0, 1) * 255).to(torch.uint8)  # (3, h, w)
        scale = torch.tensor([w, h, w, h], dtype=torch.float32)
        gt = box_convert(t["boxes"].float().cpu() * scale, "cxcywh", "xyxy")  # (N, 4) pixels
        order = det["scores"].argsort(descending=True).cpu()
        tiles.append({
            "pixels": pixels.permute(1, 2, 0).numpy(),  # (h, w, 3)
            "image_id": int(t["image_id"]),
            "truth": [(b, _name(names, c)) for b, c in zip(gt.tolist(), t["labels"].tolist())],
            "detections": [(b, _name(names, c), float(s)) for b, c, s in
                           zip(det["boxes"].cpu()[order].tolist(), det["labels"].cpu()[order].tolist(),
                               det["scores"].cpu()[order].tolist())],
        })
    return plot_detections(tiles, path, score=score, title=title if title is not None else Path(path).stem)


def _name(names: dict, c: int) -> str:
    return names.get(int(c), f"id {int(c)}")  # a class id that is no category of the data set


def _one_per_box(detections: list) -> list:
    """The best-scored detection of each distinct box, best first."""
    seen, out = set(), []
    for d in sorted(detections, key=lambda d: -d[2]):
        key = tuple(round(v, 3) for v in d[0])
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def _label(ax, x: float, y: float, text: str, colour: str, below: bool, placed: list, renderer) -> tuple:
    """Draw a label with its corner at (x, y) (image pixels), moved a line further from its box (down
    for a label below the box, up for one above) until it overlaps no label in ``placed`` (display
    boxes of the tile's labels so far, to which its own is added); returns its anchor and extent."""
    t = ax.text(x, y, text, color="white", fontsize=8, ha="left", va="top" if below else "bottom", clip_on=False,
                bbox=dict(facecolor=colour, alpha=0.85, pad=1.0, linewidth=0))
    t.set_in_layout(False)
    for _ in range(MAX_SHIFTS):
        bb = t.get_window_extent(renderer).padded(LABEL_PAD_PX)
        hit = [p for p in placed if bb.overlaps(p)]
        if not hit:
            break
        dx, _ = ax.transData.transform((x, y))  # display pixels, y up (the image's y axis points down)
        # the anchor is the label's top (below a box) or bottom (above one): past the labels it hits
        dy = min(p.y0 for p in hit) - LABEL_PAD_PX - 1 if below else max(p.y1 for p in hit) + LABEL_PAD_PX + 1
        x, y = ax.transData.inverted().transform((dx, dy))
        t.set_position((x, y))
    bb = t.get_window_extent(renderer).padded(LABEL_PAD_PX)
    placed.append(bb)
    return (float(x), float(y)), (bb.x0, bb.y0, bb.x1, bb.y1)


def _box(ax, box, colour: str, style: str) -> None:
    from matplotlib import patheffects
    from matplotlib.patches import Rectangle

    x0, y0, x1, y1 = box
    ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, ec=colour, lw=1.6, ls=style, path_effects=[
        patheffects.Stroke(linewidth=3.2, foreground="black", alpha=0.5), patheffects.Normal()]))  # seen on any colour


def plot_detections(tiles: list[dict], path: str | Path, *, score: float, title: str = "") -> list[dict]:
    """Draw ``tiles`` (each ``pixels`` (h, w, 3) uint8, ``image_id``, ``truth`` [(xyxy, name)],
    ``detections`` [(xyxy, name, score)] best first) to ``path``; return every label drawn as
    ``{"tile", "kind", "text", "box", "at"}`` (``at``: the label's anchor in image pixels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from vispe.train.logging import atomic_write

    n = len(tiles)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    H = max(t["pixels"].shape[0] for t in tiles)
    W = max(t["pixels"].shape[1] for t in tiles)
    margin = max(0.12 * H, 8.0)  # above and below the image, for the labels of boxes at an edge
    zoom = min(SCALE, TILE_PX / max(H, W))
    tile_w, tile_h = W * zoom / DPI, (H + 2 * margin) * zoom / DPI + 0.5  # inches; + the two-line title
    fig, axes = plt.subplots(rows, cols, figsize=(cols * tile_w, rows * tile_h + 0.9), dpi=DPI, squeeze=False)
    drawn, labels = [], []  # labels: drawn once the layout is fixed (their places are measured on it)
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.axis("off")
            continue
        t = tiles[i]
        h, w = t["pixels"].shape[:2]
        ax.imshow(t["pixels"], extent=(0, w, h, 0), interpolation="nearest" if zoom >= 1 else "antialiased")
        ax.set_xlim(0, W)
        ax.set_ylim(H + margin, -margin)
        ax.set_facecolor("#e8e8e8")
        ax.set_xticks([])
        ax.set_yticks([])
        detections = _one_per_box(t["detections"])
        passed = [d for d in detections if d[2] >= score]
        kind = "prediction" if passed else "top-k"
        shown = passed[:MAX_SHOWN] if passed else detections[:TOP_K]
        for box, name in t["truth"]:  # label above the box, inside the axes horizontally
            at = (min(max(box[0], 0.0), W - 1.0), max(box[1], -margin + 1.0) - 0.5)
            _box(ax, box, COLOURS["truth"], STYLES["truth"])
            labels.append((ax, at, name, "truth", False, {"tile": i, "kind": "truth", "text": name, "box": box}))
        for box, name, s in shown:  # label below the box
            at = (min(max(box[0], 0.0), W - 1.0), min(box[3], H + margin - 1.0) + 0.5)
            _box(ax, box, COLOURS[kind], STYLES[kind])
            text = f"{name} {s:.2f}"
            labels.append((ax, at, text, kind, True, {"tile": i, "kind": kind, "text": text, "box": box}))
        head = f"image {t['image_id']}: {len(t['truth'])} true"  # two lines: fits a tile at any size
        if passed:
            note = f"{head}\n{len(passed)} predicted \u2265 {score:g}"
            if len(shown) < len(passed):
                note += f", {len(shown)} best shown"
        elif len(shown) == TOP_K:
            note = f"{head}\nnone \u2265 {score:g}: top {len(shown)} shown (best {shown[0][2]:.2f})"
        elif shown:  # fewer distinct boxes than TOP_K: the predictions coincide (one box, several queries)
            n_pred = len(t["detections"])
            note = (f"{head}\nnone \u2265 {score:g}: {len(shown)} box{'es' if len(shown) > 1 else ''} shown, "
                    f"all {n_pred} predictions on {'them' if len(shown) > 1 else 'it'} (best {shown[0][2]:.2f})")
        else:
            note = f"{head}\nno prediction"
        ax.set_title(note, fontsize=9)
        drawn.append({"tile": i, "kind": "note", "text": note, "box": None, "at": None})
    head = f"{title}: " if title else ""
    fig.suptitle(f"{head}true boxes and predictions with score \u2265 {score:g} (task.vis_score), "
                 f"{zoom:.2g}x", fontsize=11)
    handles = [Line2D([], [], color=COLOURS["truth"], ls=STYLES["truth"], lw=2, label="truth: class"),
               Line2D([], [], color=COLOURS["prediction"], ls=STYLES["prediction"], lw=2,
                      label=f"prediction \u2265 {score:g}: class score"),
               Line2D([], [], color=COLOURS["top-k"], ls=STYLES["top-k"], lw=2,
                      label=f"top {TOP_K} when none reaches {score:g}")]
    legend = fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=9, frameon=False)
    drawn.append({"tile": None, "kind": "legend", "text": " | ".join(t.get_text() for t in legend.get_texts()),
                  "box": None, "at": None})
    fig.tight_layout(rect=(0, 0.06 if rows == 1 else 0.04, 1, 0.97), h_pad=1.2)
    renderer, placed = fig.canvas.get_renderer(), {}
    for ax, at, text, kind, below, record in labels:  # each clear of its tile's labels drawn before it
        at, extent = _label(ax, *at, text, COLOURS[kind], below, placed.setdefault(record["tile"], []), renderer)
        drawn.append({**record, "at": at, "extent": extent})
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buf.getvalue())
    return drawn
