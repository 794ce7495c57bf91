"""The embedded detection set "shapes": coloured shapes on textured backgrounds, in COCO layout.

``ensure_shapes(root=None, seed=0, **options)`` writes the set on first use and returns its
folder; it is then read by the same loader as COCO (``vispe.data.coco``)::

    folder/annotations/instances_{train,val}2017.json   folder/{train,val}2017/<id:012d>.jpg
    folder/vispe_shapes.json   the completion stamp: generator version, seed and options

Content (deterministic given ``seed`` and the options): images of independent height and width
in ``[min_side, max_side]`` (default 64..96, so batches get padded) on textured backgrounds (a
base colour, smooth colour blotches, stripes or a checkerboard or neither, pixel noise); 0 to
``max_objects`` (default 4) objects per image, so about one image in five has none; classes
(category ids 1..5) square, disc, triangle (pointing up, down, left or right), cross and ring,
``min_object``..``max_object`` pixels wide (default 12..40), in a colour far from the
background under it: with ``colours="by_class"`` (default) of the class's own hue (0, 0.2, 0.4,
0.6, 0.8 for ids 1..5, +-0.04, random saturation and brightness), so colour as well as shape tells
the classes apart and a small detector trained from scratch on a CPU learns in minutes what the
experiment is about, where the objects are; ``colours="random"`` leaves shape alone to tell them
apart (much slower to learn: a small DETR stayed at the class prior for 800 steps). Objects do not overlap (2-pixel gap); three in four lie wholly inside the
image, the others may be cut by the border (at least 40 % of the shape and 6 pixels in each
direction visible). The box of an object is the tight box of its visible pixels ``[x, y, w, h]``
(pixel edges) and ``area`` its pixel count. JPEG quality 90. Defaults: 1,500 train and 200 val
images (about 7 MB). The loader's defaults for this set: ``img_size=64``, ``max_size=96``.

Writing is atomic: the set is written into a temporary sibling folder, the stamp last, and
renamed into place; a run killed half-way leaves only the temporary folder (removed by the next
call on the same host once its process is gone). Processes writing the same set at once (DDP
ranks) each write their own copy; the first rename wins and the others find it complete. A
folder with the stamp of other options is refused (choose another ``root``); a non-empty folder
without a stamp is refused (it is not a complete set). ``root=None`` gives
``$VISPE_DATA/shapes/seed<seed>-<hash of the options>`` (``./data/...`` without ``$VISPE_DATA``).
"""
from __future__ import annotations

import colorsys
import hashlib
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from vispe import _checks
from vispe.data.coco import SPLITS, data_root, split_paths

VERSION = 2  # 2: options colours, texture, bg_saturation
STAMP = "vispe_shapes.json"
CATEGORIES = {1: "square", 2: "disc", 3: "triangle", 4: "cross", 5: "ring"}
DEFAULTS = dict(n_train=1500, n_val=200, min_side=64, max_side=96, min_object=12, max_object=40, max_objects=4,
                colours="by_class", texture=1.0, bg_saturation=0.25)
COLOURS = ("by_class", "random")
_HUE_JITTER = 0.04  # by_class: hue within +-0.04 of the class's own (hues 0, 0.2, 0.4, 0.6, 0.8)
IMG_SIZE, MAX_SIZE = 64, 96  # the loader's defaults for this set: shorter side, cap on the longer side
JPEG_QUALITY = 90
_GAP, _MIN_VISIBLE, _MIN_SIDE, _MIN_CONTRAST, _TRIES, _CUT = 2, 0.4, 6, 90.0, 40, 0.25


def shapes_options(kwargs: dict) -> dict:
    """``DEFAULTS`` updated with ``kwargs``, checked; an unknown option is a ValueError naming it."""
    for key, value in kwargs.items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown option {key}={value!r} for data set 'shapes'; valid options: "
                             f"{', '.join(sorted(DEFAULTS))}")
    opts = {**DEFAULTS, **kwargs}
    _checks.choice("colours", opts["colours"], COLOURS)
    for key in ("texture", "bg_saturation"):
        v = opts[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise ValueError(f"{key}={v!r}: expected a number in [0, 1]")
    for key in ("n_train", "n_val", "min_side", "max_side", "min_object", "max_object"):
        _checks.positive_int(key, opts[key])
    _checks.positive_int("max_objects", opts["max_objects"], allow_zero=True)
    for lo, hi in (("min_side", "max_side"), ("min_object", "max_object")):
        if opts[lo] > opts[hi]:
            raise ValueError(f"{lo}={opts[lo]}: expected at most {hi}={opts[hi]}")
    if opts["min_object"] < 2 * _MIN_SIDE:
        raise ValueError(f"min_object={opts['min_object']}: expected at least {2 * _MIN_SIDE} pixels")
    if opts["max_object"] > opts["min_side"]:
        raise ValueError(f"max_object={opts['max_object']}: expected at most min_side={opts['min_side']}")
    return opts


def _stamp(seed: int, opts: dict) -> dict:
    return {"generator": "vispe.data.shapes", "version": VERSION, "seed": seed, "jpeg_quality": JPEG_QUALITY,
            **opts}


def default_folder(seed: int, opts: dict) -> Path:
    digest = hashlib.sha256(json.dumps(_stamp(seed, opts), sort_keys=True).encode()).hexdigest()[:10]
    return data_root() / "shapes" / f"seed{seed}-{digest}"


def ensure_shapes(root=None, seed: int = 0, **kwargs) -> Path:
    """The folder of the shapes set for ``seed`` and options ``kwargs``, written if not there yet."""
    _checks.positive_int("seed", seed, allow_zero=True)
    opts = shapes_options(kwargs)
    stamp = _stamp(seed, opts)
    folder = default_folder(seed, opts) if root is None else Path(root).expanduser()
    if _is_complete(folder, stamp):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(folder)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(folder), dir=folder.parent))
    try:
        write_shapes(tmp, seed, opts)
        (tmp / STAMP).write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")  # last: marks completion
        try:
            os.rename(tmp, folder)  # atomic; allowed onto an empty folder
        except OSError:
            if not _is_complete(folder, stamp):  # else another process finished the same set first
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _is_complete(folder: Path, stamp: dict) -> bool:
    if not folder.exists():
        return False
    path = folder / STAMP
    if not path.is_file():
        if folder.is_dir() and not any(folder.iterdir()):
            return False
        raise ValueError(f"root={str(folder)!r} holds files but no {STAMP}: it is not a complete shapes set (a "
                         "half-written set is never moved into place); delete it or choose another root")
    try:
        found = json.loads(path.read_text())
    except json.JSONDecodeError:
        found = {"stamp": "unreadable"}
    if found != stamp:
        diff = ", ".join(f"{k}: has {found.get(k)!r}, asked {stamp.get(k)!r}"
                         for k in sorted(set(found) | set(stamp)) if found.get(k) != stamp.get(k))
        raise ValueError(f"root={str(folder)!r} holds a shapes set made with other settings ({diff}); "
                         "choose another root or delete it")
    return True


def _temp_prefix(folder: Path) -> str:
    return f".{folder.name}.tmp-{os.getpid()}@{socket.gethostname()}-"


def _remove_stale_temps(folder: Path) -> None:
    """Delete temporary folders of ``folder`` left by processes of this host that no longer run
    (another host's, e.g. a rank of a multi-node run on a shared disk, are left alone)."""
    for tmp in folder.parent.glob(f".{folder.name}.tmp-*@*"):
        pid, _, rest = tmp.name[len(folder.name) + 6:].partition("@")
        if rest.rsplit("-", 1)[0] != socket.gethostname() or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except OSError:  # e.g. PermissionError: the process exists
            continue


def write_shapes(folder: Path, seed: int, opts: dict) -> None:
    """Write both splits into ``folder`` (COCO layout); image and annotation ids are unique across splits."""
    first_image, first_ann = 1, 1
    for split in SPLITS:
        images, anns = _write_split(folder, split, seed, opts, first_image, first_ann)
        first_image, first_ann = first_image + images, first_ann + anns


def _write_split(folder: Path, split: str, seed: int, opts: dict, first_image: int, first_ann: int):
    img_dir, ann_file = split_paths(folder, split)
    img_dir.mkdir(parents=True)
    ann_file.parent.mkdir(exist_ok=True)
    images, anns = [], []
    for i in range(opts[f"n_{split}"]):
        rng = np.random.default_rng([seed, SPLITS.index(split), i])
        pixels, objects = render_image(rng, opts)
        image_id = first_image + i
        name = f"{image_id:012d}.jpg"
        _save_image(Image.fromarray(pixels), img_dir / name)
        images.append({"id": image_id, "file_name": name, "height": pixels.shape[0], "width": pixels.shape[1]})
        for cat, mask in objects:
            ys, xs = np.nonzero(mask)
            x0, y0 = int(xs.min()), int(ys.min())
            anns.append({"id": first_ann + len(anns), "image_id": image_id, "category_id": cat, "iscrowd": 0,
                         "bbox": [x0, y0, int(xs.max()) + 1 - x0, int(ys.max()) + 1 - y0],
                         "area": int(mask.sum()), "segmentation": []})
    data = {"info": {"description": f"vispe shapes, {split}", "version": str(VERSION)}, "licenses": [],
            "images": images, "annotations": anns,
            "categories": [{"id": k, "name": v, "supercategory": "shape"} for k, v in CATEGORIES.items()]}
    ann_file.write_text(json.dumps(data))
    return len(images), len(anns)


def _save_image(image: Image.Image, path: Path) -> None:
    image.save(path, quality=JPEG_QUALITY)


def render_image(rng: np.random.Generator, opts: dict) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """One image: pixels uint8 (h, w, 3) and its objects as (category id, visible mask (h, w) bool)."""
    h, w = (int(v) for v in rng.integers(opts["min_side"], opts["max_side"] + 1, size=2))
    pixels = texture(rng, h, w, opts["texture"], opts["bg_saturation"])  # (h, w, 3)
    objects, boxes = [], []
    for _ in range(int(rng.integers(0, opts["max_objects"] + 1))):
        cat = int(rng.integers(1, len(CATEGORIES) + 1))
        s = int(rng.integers(opts["min_object"], opts["max_object"] + 1))
        shape = shape_mask(cat, s, rng)  # (s, s)
        cut = rng.random() < _CUT  # may the border cut it? (else it lies wholly inside)
        lo = -(s // 2) if cut else 0
        for _ in range(_TRIES):
            y0, x0 = int(rng.integers(lo, h - s + 1 - lo)), int(rng.integers(lo, w - s + 1 - lo))
            if any(y0 < b[2] + _GAP and b[0] < y0 + s + _GAP and x0 < b[3] + _GAP and b[1] < x0 + s + _GAP
                   for b in boxes):
                continue
            mask = np.zeros((h, w), dtype=bool)
            ys, xs = slice(max(y0, 0), min(y0 + s, h)), slice(max(x0, 0), min(x0 + s, w))
            mask[ys, xs] = shape[ys.start - y0: ys.stop - y0, xs.start - x0: xs.stop - x0]
            ry, rx = np.nonzero(mask.any(1))[0], np.nonzero(mask.any(0))[0]
            if mask.sum() < _MIN_VISIBLE * shape.sum() or len(ry) < _MIN_SIDE or len(rx) < _MIN_SIDE:
                continue
            pixels[mask] = _colour(rng, pixels[ys, xs].reshape(-1, 3).mean(0), cat if opts["colours"] == "by_class" else None)
            objects.append((cat, mask))
            boxes.append((y0, x0, y0 + s, x0 + s))
            break
    return pixels, objects


def _colour(rng, background: np.ndarray, cat: int | None = None) -> np.ndarray:
    """A random RGB colour at least ``_MIN_CONTRAST`` away from ``background`` (3,); with ``cat``, of that
    class's hue (saturation and brightness still random), so colour tells the classes apart."""
    for _ in range(100):
        if cat is None:
            c = rng.integers(0, 256, size=3)
        else:
            hue = ((cat - 1) / len(CATEGORIES) + rng.uniform(-_HUE_JITTER, _HUE_JITTER)) % 1.0
            c = np.array(colorsys.hsv_to_rgb(hue, rng.uniform(0.55, 1.0), rng.uniform(0.45, 1.0))) * 255
        if np.linalg.norm(c - background) >= _MIN_CONTRAST:
            return np.asarray(c).round().astype(np.uint8)
    return (255 - background).astype(np.uint8)  # the complement is always far from a mid colour


def shape_mask(cat: int, s: int, rng: np.random.Generator) -> np.ndarray:
    """The filled pixels (s, s) bool of shape ``cat`` inscribed in an s x s square (touching all 4 sides)."""
    im = Image.new("L", (s, s))
    d, e = ImageDraw.Draw(im), s - 1
    if cat == 1:
        d.rectangle((0, 0, e, e), fill=1)
    elif cat == 2:
        d.ellipse((0, 0, e, e), fill=1)
    elif cat == 3:
        tri = [(e / 2, 0), (0, e), (e, e)]  # pointing up, then turned by a multiple of 90 degrees
        k = int(rng.integers(0, 4))
        for _ in range(k):
            tri = [(y, e - x) for x, y in tri]
        d.polygon(tri, fill=1)
    elif cat == 4:
        t = max(3, s // 3)
        a = (s - t) // 2
        d.rectangle((0, a, e, a + t - 1), fill=1)
        d.rectangle((a, 0, a + t - 1, e), fill=1)
    else:
        t = max(3, s // 4)
        d.ellipse((0, 0, e, e), fill=1)
        d.ellipse((t, t, e - t, e - t), fill=0)
    return np.asarray(im, dtype=bool)


def texture(rng: np.random.Generator, h: int, w: int, strength: float = 1.0, saturation: float = 1.0) -> np.ndarray:
    """A background (h, w, 3) uint8: base colour + smooth blotches + stripes / checkerboard / none + noise.

    ``strength`` scales the amplitude of everything but the base colour (1: blotches of std 30,
    stripes or checkers of amplitude 8..25, noise of 6..24; 0: a flat colour); ``saturation`` scales
    each pixel's distance from its grey level (1: as drawn; 0: grey). The random draws depend on
    neither, so the same seed gives the same layout at every setting.
    """
    base = rng.uniform(40, 215, size=3).astype(np.float32)  # (3,)
    gh, gw = (int(v) for v in rng.integers(2, 7, size=2))
    blotch = rng.normal(0, 30, size=(gh, gw, 3)).astype(np.float32) * np.float32(strength)
    out = np.stack([np.asarray(Image.fromarray(blotch[..., c], mode="F").resize((w, h), Image.BILINEAR))
                    for c in range(3)], -1) + base  # (h, w, 3)
    yy, xx = np.arange(h, dtype=np.float32)[:, None], np.arange(w, dtype=np.float32)[None, :]  # (h, 1), (1, w)
    kind, amp = int(rng.integers(0, 3)), rng.uniform(8, 25, size=3).astype(np.float32) * np.float32(strength)
    if kind == 1:
        theta, period = rng.uniform(0, np.pi), rng.uniform(5, 20)
        out += np.sin((2 * np.pi / period) * (xx * np.cos(theta) + yy * np.sin(theta)))[..., None] * amp
    elif kind == 2:
        p = int(rng.integers(5, 20))
        out += (((yy // p + xx // p) % 2) * 2 - 1)[..., None] * amp
    out += (rng.random(size=(h, w, 3), dtype=np.float32) - 0.5) * np.float32(rng.uniform(6, 24) * strength)  # noise
    grey = out.mean(-1, keepdims=True)  # (h, w, 1)
    out = grey + (out - grey) * np.float32(saturation)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
