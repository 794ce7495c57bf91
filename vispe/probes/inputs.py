"""Probe inputs: natural photos, constant images and noise, as in Islam, Jia & Bruce (ICLR 2020),
who read position from natural images (PASCAL-S) and from black, white and noise images.

``make_inputs(kind, n, size, split=..., seed=...)`` returns ``(n, 3, h, w)`` float32 in [0, 1]:

* ``"natural"``: random crops of scikit-learn's sample photos (``load_sample_images``), square
  crops of 40-100 % of the short side, resized to ``size`` (bilinear, antialiased). Each crop
  comes in its four flips (as is, left-right, up-down, both; image k is flip k % 4 of crop k // 4),
  so the set is symmetric under flips: photo content (sky on top) cannot tie to position, neither
  in what a probe learns nor in how it is scored.
  ``split="train"`` crops ``china.jpg``, ``split="test"`` crops ``flower.jpg``: the probe is
  tested on a photo it never saw.
* ``"constant"``: one grey level per image, uniform in [0.1, 0.9]. A blank image has no content,
  so any position a probe reads from it comes from the borders (the padding).
* ``"noise"``: i.i.d. uniform [0, 1] pixels.

Train and test draws use different seeds (``seed`` and ``split`` both enter the generator).
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from vispe import _checks

INPUTS = ("natural", "constant", "noise")
SPLITS = ("train", "test")


@lru_cache(maxsize=1)
def _photos() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_sample_images

    data = load_sample_images()
    by_name = {f.rsplit("/", 1)[-1]: img for f, img in zip(data.filenames, data.images)}
    return tuple(torch.from_numpy(by_name[n].copy()).permute(2, 0, 1).float().div(255)  # (3, H, W)
                 for n in ("china.jpg", "flower.jpg"))


def natural_crops(n: int, size, *, split: str = "train", generator: torch.Generator | None = None) -> torch.Tensor:
    """Random square crops of a sample photo resized to ``size``, in all four flips.  # (n, 3, h, w)"""
    h, w = _checks.grid_shape("size", size)
    photo = _photos()[SPLITS.index(_checks.choice("split", split, SPLITS))]  # (3, H, W)
    H, W = photo.shape[-2:]
    out = []
    for k in range(n):
        if k % 4 == 0:
            side = int(min(H, W) * (0.4 + 0.6 * torch.rand((), generator=generator).item()))
            y0 = int(torch.randint(0, H - side + 1, (), generator=generator))
            x0 = int(torch.randint(0, W - side + 1, (), generator=generator))
            crop = photo[None, :, y0:y0 + side, x0:x0 + side]  # (1, 3, side, side)
            crop = F.interpolate(crop, size=(h, w), mode="bilinear", align_corners=False, antialias=True)
        flips = [(), (-1,), (-2,), (-2, -1)][k % 4]
        out.append(crop.flip(flips) if flips else crop)
    return torch.cat(out).clamp(0, 1)  # (n, 3, h, w)


def make_inputs(kind: str, n: int, size=(64, 64), *, split: str = "train", seed: int = 0) -> torch.Tensor:
    """``n`` probe inputs of ``kind`` in ``INPUTS`` (see the module docstring).  # (n, 3, h, w)"""
    _checks.choice("kind", kind, INPUTS)
    _checks.positive_int("n", n)
    h, w = _checks.grid_shape("size", size)
    _checks.choice("split", split, SPLITS)
    g = torch.Generator().manual_seed(2 * int(seed) + SPLITS.index(split))
    if kind == "natural":
        return natural_crops(n, (h, w), split=split, generator=g)
    if kind == "constant":
        level = 0.1 + 0.8 * torch.rand(n, 1, 1, 1, generator=g)  # (n, 1, 1, 1)
        return level.expand(n, 3, h, w).contiguous()
    return torch.rand(n, 3, h, w, generator=g)
