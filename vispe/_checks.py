"""Input checks shared by every module: one place that words the errors.

Each check raises a ValueError naming the argument, the value given and what was expected.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import torch

from vispe import _tracing

T = TypeVar("T")


def positive_int(name: str, value, *, allow_zero: bool = False) -> int:
    """Return ``value`` as an int, or raise if it is not a (strictly) positive integer."""
    ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        want = "a non-negative integer" if allow_zero else "a positive integer"
        raise ValueError(f"{name}={value!r}: expected {want}")
    return value


def positive_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}={value!r}: expected a positive number")
    return float(value)


def divisible(name: str, value: int, by: int, why: str = "") -> int:
    positive_int(name, value)
    if value % by:
        extra = f" ({why})" if why else ""
        raise ValueError(f"{name}={value}: expected a multiple of {by}{extra}")
    return value


def choice(name: str, value: T, choices: Iterable[object]) -> T:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(map(repr, choices))}")
    return value


def grid_shape(name: str, value) -> tuple[int, int]:
    """An (h, w) pair of positive ints (an int n means (n, n)).

    Sizes being recorded by torch.export / torch.compile (``torch.SymInt``) are kept symbolic, so
    the recorded graph stays valid at every size; ``torch.jit.trace``, which would record them as
    constants, is refused (``vispe._tracing.refuse_jit_trace``).
    """
    _tracing.refuse_jit_trace("a vispe encoding")
    if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"{name}={value!r}: expected an (h, w) pair of positive integers")
    h, w = value
    for v in (h, w):
        if isinstance(v, torch.SymInt):
            _tracing.check(v > 0, f"{name}={value!r}: expected an (h, w) pair of positive integers")
        elif not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
            raise ValueError(f"{name}={value!r}: expected an (h, w) pair of positive integers")
    return h, w


def mask_for(name: str, mask: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor | None:
    """A padding mask (B, h, w) of bools (True = padding) matching ``shape``, or None."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dim() != 3 or tuple(mask.shape[1:]) != tuple(shape):
        got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name} has shape {got}: expected (B, {shape[0]}, {shape[1]}) (True = padding)")
    if mask.dtype != torch.bool:
        raise ValueError(f"{name} has dtype {mask.dtype}: expected torch.bool (True = padding)")
    return mask


def last_dim(name: str, tensor: torch.Tensor, size: int) -> torch.Tensor:
    if tensor.shape[-1] != size:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}: expected last dimension {size}")
    return tensor


def images(name: str, x, mask=None, *, in_chans: int | None = None, multiple_of: tuple[int, int] | None = None,
           check_finite: bool = False) -> None:
    """Refuse a batch of images ``x`` (B, C, H, W) and padding mask (B, H, W) a model cannot run on.

    The one rule set of every vispe model (ViT and DETR): a float tensor of 4 dimensions with B, H, W
    of at least 1 (an integer image, e.g. uint8 pixels, is refused: convert and normalise it as the
    model was trained), ``in_chans`` channels and H, W multiples of ``multiple_of`` when given; a bool
    mask (True = padding) of x's batch and size with at least one valid pixel per image; with
    ``check_finite``, no NaN or inf pixel (padded pixels included: they go through the first layer).
    The checks of values (all-padding, finite) run in eager mode only: while torch.compile or
    torch.export records the model they would be data-dependent branches.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} is a {type(x).__name__}: expected a torch.Tensor (B, C, H, W)")
    if x.dim() != 4:
        raise ValueError(f"{name} has shape {tuple(x.shape)}: expected (B, C, H, W), a batch of images")
    if not x.is_floating_point():
        raise ValueError(f"{name} has dtype {x.dtype}: expected a floating-point tensor (convert integer pixels, "
                         f"e.g. {name}.float() / 255, and normalise them as the model was trained)")
    B, C, H, W = x.shape
    if B == 0 or H == 0 or W == 0:
        raise ValueError(f"{name} has shape {tuple(x.shape)}: expected B, H and W of at least 1")
    if in_chans is not None and C != in_chans:
        raise ValueError(f"{name} has {C} channels (shape {tuple(x.shape)}): expected in_chans={in_chans}")
    if multiple_of is not None and (H % multiple_of[0] or W % multiple_of[1]):
        raise ValueError(f"{name} has size (H, W)=({H}, {W}): expected multiples of the patch size {tuple(multiple_of)}")
    if mask is not None:
        mask_for("mask", mask, (H, W))
        if mask.shape[0] != B:
            raise ValueError(f"mask has shape {tuple(mask.shape)}: expected ({B}, {H}, {W}), one mask per image "
                             f"of {name}")
    if _tracing.is_tracing():
        return
    if mask is not None:
        empty = mask.flatten(1).all(1)  # (B,)
        if empty.any():
            i = int(empty.nonzero()[0])
            raise ValueError(f"mask[{i}] is all padding: expected at least one valid (False) pixel per image")
    if check_finite:
        bad = ~torch.isfinite(x).flatten(1).all(1)  # (B,)
        if bad.any():
            raise ValueError(f"{name} holds NaN or inf in image(s) {bad.nonzero()[:, 0].tolist()}: expected finite "
                             "pixel values (check the data; check_finite=True)")
