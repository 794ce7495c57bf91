"""A picture of a detector's predictions: predicted boxes (red, with class and score) and true boxes
(green) on the first images of a data set, in one PNG grid (torchvision's ``draw_bounding_boxes``)."""
from __future__ import annotations

import io
from pathlib import Path

import torch
from PIL import Image
from torchvision.ops import box_convert
from torchvision.utils import draw_bounding_boxes, make_grid

from vispe.models.detr.postprocess import postprocess


@torch.no_grad()
def draw_predictions(model, dataset, path: str | Path, *, device, collate_fn, info, n: int = 6,
                     score: float = 0.5) -> None:
    """Run ``model`` on ``dataset[0:n]`` and write the annotated images to ``path`` (PNG, atomically)."""
    from vispe.train.logging import atomic_write

    n = min(n, len(dataset))
    if n == 0:
        return
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
        gt = box_convert(t["boxes"].float() * scale, "cxcywh", "xyxy")
        if len(gt):
            pixels = draw_bounding_boxes(pixels, gt, colors="lime", width=1)
        keep = det["scores"] > score
        if keep.any():
            labels = [f"{names.get(int(c), c)} {s:.2f}"
                      for c, s in zip(det["labels"][keep].tolist(), det["scores"][keep].tolist())]
            pixels = draw_bounding_boxes(pixels, det["boxes"][keep].cpu(), labels=labels, colors="red", width=1)
        tiles.append(pixels)
    H, W = max(t.shape[1] for t in tiles), max(t.shape[2] for t in tiles)
    tiles = [torch.nn.functional.pad(t, (0, W - t.shape[2], 0, H - t.shape[1])) for t in tiles]
    grid = make_grid(torch.stack(tiles), nrow=min(n, 3), padding=2)  # (3, H', W') uint8
    buf = io.BytesIO()
    Image.fromarray(grid.permute(1, 2, 0).numpy()).save(buf, format="PNG")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buf.getvalue())
