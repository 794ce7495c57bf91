"""Embedded position tasks: real handwritten digits placed on a blank canvas. No download.

Source images: scikit-learn's ``load_digits`` (the UCI optdigits test set, Alpaydin & Kaynak
1998): 1797 grey images of 8x8 pixels, intensities 0..16 (scaled here to [0, 1]); the file ships
with scikit-learn. A fixed class-stratified split (seed 0, ``TEST_FRACTION`` of each class) keeps
the digit images of the test split out of the train split, whatever the sample ``seed``.

Each task draws ``n_train`` / ``n_test`` samples (labels exactly balanced) from the split's digit
images, deterministically from ``(seed, split, task)``. Positions are integer top-left corners
``(y, x)`` on an ``S x S`` canvas (``canvas``, default 32); a digit is a square of side
``s = digit_size`` (the 8x8 source resized, bilinear with antialiasing). Background is 0.

| name | classes | label |
|---|---|---|
| ``digits_class`` | 10 | the digit's class; the digit (s=16) anywhere (uniform): translation-invariant control, no position needed |
| ``digits_cell`` | k*k | the cell ``row * k + col`` of a k x k grid (k=3) holding the digit (s=8, wholly inside the cell, random class): a permutation-invariant model is at chance |
| ``digits_relative`` | 4 | two digits of different classes (s=8), A = the smaller class: ``2 * [y_A > y_B] + [x_A > x_B]`` (0 = A above-left of B); abs(dy), abs(dx) >= ``margin`` (4), no overlap (max(abs(dy), abs(dx)) >= s). Same layout, A and B swapped: label ``3 - label``, so position alone cannot answer |
| ``digits_content_position`` | 20 | ``class`` if the digit (s=12) lies wholly in the left half (x + s <= S/2), else ``10 + class`` (wholly in the right half, x >= S/2): needs content and position |

Sizes were chosen so that each task is learnable at 32x32: 8x8 digits are the source resolution
(about 97% linear accuracy) and fit a 3x3 cell with 3 positions of jitter; the class task
upscales 2x. Options (all tasks): ``canvas``, ``in_chans`` (1, or 3 replicated channels),
``n_train``, ``n_test``, ``digit_size``; ``k`` (cell), ``margin`` (relative).

Rendering at ``img_size`` (H, W) != (S, S): a digit at ``(y, x)`` occupies rows
``[round(y * H / S), round((y + s) * H / S))`` and columns likewise; rounding is monotonic, so
the layout (cells, halves, order, no overlap) and the label are those of the canvas at every size
(a non-square size stretches the digits).
Output: ``(C, H, W)`` float32, normalised with the mean/std of 2000 native-size train samples
(seed 0), the same whatever ``img_size``, ``n_train``, ``in_chans``.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from vispe import _checks
from vispe.data.common import (
    SPLITS,
    DatasetInfo,
    check_img_size,
    check_options,
    check_seed,
    check_split,
    check_train_augment,
)

TASKS = ("class", "cell", "relative", "content_position")
TEST_FRACTION = 0.3
_STATS_N = 2000
_COMMON = dict(canvas=32, in_chans=3, n_train=4000, n_test=1000)
_TASK_OPTIONS = {"class": dict(digit_size=16), "cell": dict(digit_size=8, k=3),
                 "relative": dict(digit_size=8, margin=4), "content_position": dict(digit_size=12)}
_RELATIVE_NAMES = ("A above-left of B", "A above-right of B", "A below-left of B", "A below-right of B")


@lru_cache(maxsize=1)
def _digits():
    """Source images (1797, 8, 8) in [0, 1], classes (1797,), and {split: indices}."""
    from sklearn.datasets import load_digits

    d = load_digits()
    images = (d.images / 16.0).astype(np.float32)  # (1797, 8, 8)
    target = d.target.astype(np.int64)  # (1797,)
    rng = np.random.default_rng(0)
    test = np.zeros(len(target), dtype=bool)
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(target == c))
        test[idx[: round(TEST_FRACTION * len(idx))]] = True
    pools = {"train": np.flatnonzero(~test), "test": np.flatnonzero(test)}
    for a in (images, target, *pools.values()):
        a.flags.writeable = False
    return images, target, pools


def source_indices(split: str) -> np.ndarray:
    """Indices into ``sklearn.datasets.load_digits()`` of the digit images ``split`` draws from."""
    return _digits()[2][check_split(split)]


def _options(task: str, kwargs: dict) -> dict:
    _checks.choice("task", task, TASKS)
    opts = check_options(f"digits_{task}", kwargs, {**_COMMON, **_TASK_OPTIONS[task]})
    for key in ("canvas", "n_train", "n_test", "digit_size", "k", "margin"):
        if key in opts:
            _checks.positive_int(key, opts[key])
    _checks.choice("in_chans", opts["in_chans"], (1, 3))
    S, s = opts["canvas"], opts["digit_size"]
    if s > S:
        raise ValueError(f"digit_size={s}: expected at most canvas={S}")
    if task == "cell":
        lo, hi = _cell_ranges(S, s, opts["k"])
        if (lo > hi).any():
            raise ValueError(f"digit_size={s}: expected at most the smallest cell of a k={opts['k']} grid "
                             f"on canvas={S} ({S // opts['k']} pixels)")
    elif task == "relative" and S - s < max(s, opts["margin"]):
        raise ValueError(f"digit_size={s}, margin={opts['margin']}: two non-overlapping digits need "
                         f"canvas - digit_size >= max(digit_size, margin); canvas={S}")
    elif task == "content_position" and 2 * s > S:
        raise ValueError(f"digit_size={s}: expected at most canvas/2 = {S / 2} so that a digit fits "
                         f"in one half of canvas={S}")
    return opts


def _cell_ranges(S: int, s: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per grid row (or column) r: the top-left coordinates keeping a digit inside the cell."""
    r = np.arange(k)
    return -(-r * S // k), (r + 1) * S // k - s  # ceil(r S / k), floor((r + 1) S / k) - s


def _num_classes(task: str, opts: dict) -> int:
    return {"class": 10, "cell": opts.get("k", 0) ** 2, "relative": 4, "content_position": 20}[task]


def _class_names(task: str, opts: dict) -> tuple[str, ...]:
    if task == "class":
        return tuple(str(c) for c in range(10))
    if task == "cell":
        return tuple(f"row {r} col {c}" for r in range(opts["k"]) for c in range(opts["k"]))
    if task == "relative":
        return _RELATIVE_NAMES
    return tuple(f"{side} {c}" for side in ("left", "right") for c in range(10))


def _pick(rng, split: str, classes: np.ndarray) -> np.ndarray:
    """A random digit image of ``split`` for each class in ``classes`` -> indices (n,)."""
    _, target, pools = _digits()
    pool = pools[split]
    out = np.empty(len(classes), dtype=np.int64)
    for c in range(10):
        sel = classes == c
        out[sel] = rng.choice(pool[target[pool] == c], size=int(sel.sum()))
    return out


@lru_cache(maxsize=32)
def _generate(task: str, opts_items: tuple, seed: int, split: str):
    """labels (n,), digit indices (n, m), top-left corners (n, m, 2) as (y, x); m = 1 or 2."""
    opts = dict(opts_items)
    S, s = opts["canvas"], opts["digit_size"]
    n = opts["n_train" if split == "train" else "n_test"]
    rng = np.random.default_rng([seed, SPLITS.index(split), TASKS.index(task)])
    labels = rng.permutation(np.arange(n) % _num_classes(task, opts))  # (n,) balanced
    if task == "class":
        digit = _pick(rng, split, labels)[:, None]  # (n, 1)
        top = rng.integers(0, S - s + 1, size=(n, 1, 2))  # (n, 1, 2)
    elif task == "cell":
        digit = _pick(rng, split, rng.integers(0, 10, size=n))[:, None]  # (n, 1)
        lo, hi = _cell_ranges(S, s, opts["k"])
        row, col = np.divmod(labels, opts["k"])
        top = np.stack([rng.integers(lo[row], hi[row] + 1), rng.integers(lo[col], hi[col] + 1)], -1)[:, None]
    elif task == "relative":
        a = rng.integers(0, 10, size=n)
        b = (a + rng.integers(1, 10, size=n)) % 10  # a class different from a
        digit = np.stack([_pick(rng, split, np.minimum(a, b)), _pick(rng, split, np.maximum(a, b))], 1)
        top = _relative_layout(rng, labels, S, s, opts["margin"])  # (n, 2, 2)
    else:
        digit = _pick(rng, split, labels % 10)[:, None]  # (n, 1)
        right = labels >= 10
        x = np.where(right, rng.integers((S + 1) // 2, S - s + 1, size=n), rng.integers(0, S // 2 - s + 1, size=n))
        top = np.stack([rng.integers(0, S - s + 1, size=n), x], -1)[:, None]  # (n, 1, 2)
    for arr in (labels, digit, top):
        arr.flags.writeable = False
    return labels, digit, top


def _relative_layout(rng, labels: np.ndarray, S: int, s: int, margin: int) -> np.ndarray:
    """Corners (n, 2, 2) of A and B: uniform over the allowed layouts having each label's order."""
    n, found = len(labels), []
    while sum(len(f) for f in found) < n:
        p = rng.integers(0, S - s + 1, size=(2 * n, 2, 2))  # (2n, [A, B], (y, x))
        d = np.abs(p[:, 0] - p[:, 1])  # (2n, 2)
        found.append(p[(d >= margin).all(1) & (d.max(1) >= s)])
    p = np.concatenate(found)[:n].copy()  # (n, 2, 2)
    for axis, want in ((0, labels // 2 == 1), (1, labels % 2 == 1)):  # y: A below B, x: A right of B
        swap = (p[:, 0, axis] > p[:, 1, axis]) != want  # exchanging coordinates keeps |d|
        p[swap, 0, axis], p[swap, 1, axis] = p[swap, 1, axis], p[swap, 0, axis]  # fancy index: copies
    return p


def digit_boxes(top: np.ndarray, digit_size: int, canvas: int, out_hw: tuple[int, int]) -> np.ndarray:
    """Pixel boxes (..., 4) as (y0, y1, x0, x1), end-exclusive, of digits at ``top`` rendered at ``out_hw``."""
    f = np.array(out_hw, dtype=np.float64) / canvas  # (2,) as (fy, fx)
    lo = np.floor(top * f + 0.5).astype(np.int64)  # (..., 2)
    hi = np.floor((top + digit_size) * f + 0.5).astype(np.int64)  # (..., 2)
    return np.stack([lo[..., 0], hi[..., 0], lo[..., 1], hi[..., 1]], -1)


@lru_cache(maxsize=16)
def _resized_sources(h: int, w: int) -> np.ndarray:
    src = torch.from_numpy(_digits()[0].copy())[:, None]  # (1797, 1, 8, 8)
    out = F.interpolate(src, size=(h, w), mode="bilinear", align_corners=False, antialias=True)
    return out[:, 0].clamp_(0, 1).numpy()  # (1797, h, w)


def render(digit: np.ndarray, top: np.ndarray, digit_size: int, canvas: int, out_hw: tuple[int, int]) -> np.ndarray:
    """Images (n, H, W) float32 in [0, 1] with digit image ``digit[i, j]`` at corner ``top[i, j]``."""
    boxes = digit_boxes(top, digit_size, canvas, out_hw)  # (n, m, 4)
    out = np.zeros((len(digit), *out_hw), dtype=np.float32)  # (n, H, W)
    for (i, j), d in np.ndenumerate(digit):
        y0, y1, x0, x1 = boxes[i, j]
        region = out[i, y0:y1, x0:x1]
        np.maximum(region, _resized_sources(y1 - y0, x1 - x0)[d], out=region)
    return out


@lru_cache(maxsize=32)
def _stats(task: str, opts_items: tuple) -> tuple[float, float]:
    """Mean and std of ``_STATS_N`` native-size train samples at seed 0: one normalisation for
    every img_size, n_train, n_test and in_chans (so a model meets the same one in evaluation)."""
    opts = {**dict(opts_items), "n_train": _STATS_N, "n_test": _STATS_N, "in_chans": 1}
    _, digit, top = _generate(task, tuple(sorted(opts.items())), 0, "train")
    x = render(digit, top, opts["digit_size"], opts["canvas"], (opts["canvas"],) * 2)
    return float(x.mean()), float(x.std())


def digits_info(task: str, **kwargs) -> DatasetInfo:
    """The ``DatasetInfo`` of task ``digits_<task>`` with options ``kwargs``."""
    opts = _options(task, kwargs)
    mean, std = _stats(task, tuple(sorted(opts.items())))
    c = opts["in_chans"]
    return DatasetInfo(num_classes=_num_classes(task, opts), in_chans=c, img_size=opts["canvas"],
                       mean=(mean,) * c, std=(std,) * c, class_names=_class_names(task, opts))


class DigitsCanvas(Dataset):
    """Task ``digits_<task>``, one split, rendered at ``img_size``; yields ``(image (C, H, W), label)``.

    Attributes for inspection: ``labels`` (n,) long; ``digits`` (n, m) indices into
    ``load_digits()``; ``tops`` (n, m, 2) canvas corners (y, x); ``boxes`` (n, m, 4) rendered
    pixel boxes (y0, y1, x0, x1); ``images`` (n, 1, H, W) normalised.
    """

    def __init__(self, task: str, split: str, *, img_size=None, seed: int = 0, train_augment=None, **kwargs):
        self.info = digits_info(task, **kwargs)
        opts = _options(task, kwargs)
        self.task, self.split, self.seed = task, check_split(split), check_seed(seed)
        self.augment = check_train_augment(train_augment, self.split)
        self.img_size = check_img_size(img_size, opts["canvas"])
        self.canvas, self.digit_size, self.in_chans = opts["canvas"], opts["digit_size"], opts["in_chans"]
        if min(self.img_size) * self.digit_size < 2 * self.canvas:
            raise ValueError(f"img_size={img_size!r}: renders {self.digit_size}-pixel digits of the "
                             f"{self.canvas}-pixel canvas below 2 pixels; expected at least "
                             f"{-(-2 * self.canvas // self.digit_size)}")
        labels, self.digits, self.tops = _generate(task, tuple(sorted(opts.items())), self.seed, self.split)
        self.labels = torch.from_numpy(labels.copy())  # (n,)
        self.boxes = digit_boxes(self.tops, self.digit_size, self.canvas, self.img_size)  # (n, m, 4)
        x = render(self.digits, self.tops, self.digit_size, self.canvas, self.img_size)  # (n, H, W)
        x = (x - np.float32(self.info.mean[0])) / np.float32(self.info.std[0])
        self.images = torch.from_numpy(x)[:, None]  # (n, 1, H, W)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x = self.images[i].repeat(self.in_chans, 1, 1)  # (C, H, W), a copy
        if callable(self.augment):
            x = self.augment(x)
        return x, int(self.labels[i])

    def __repr__(self) -> str:
        return (f"DigitsCanvas(task={self.task!r}, split={self.split!r}, n={len(self)}, "
                f"img_size={self.img_size}, seed={self.seed})")
