"""What every vispe data set shares: its description (``DatasetInfo``) and the argument checks.

Every data set yields ``(image, label)``: ``image`` a float32 tensor ``(C, H, W)`` normalised
with ``DatasetInfo.mean`` / ``.std`` (per channel), ``label`` an ``int`` in ``[0, num_classes)``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vispe import _checks

SPLITS = ("train", "test")


class DataFileError(ValueError):
    """A data file that cannot be read while a run is going (missing, corrupt, truncated, of the wrong
    size); the message names the file. train.py reports it as an error and keeps what it wrote."""
AUGMENT_MODES = ("default", "none")


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a data set before seeing it.

    ``img_size`` is the native (square) side length; ``mean`` / ``std`` have one entry per channel
    and are the ones the data set applies, at every ``img_size``.
    """

    num_classes: int
    in_chans: int
    img_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...]


def check_split(split) -> str:
    return _checks.choice("split", split, SPLITS)


def check_img_size(img_size, native: int) -> tuple[int, int]:
    """``None`` -> ``(native, native)``; an int ``n`` -> ``(n, n)``; an ``(h, w)`` pair as given."""
    if img_size is None:
        return native, native
    return _checks.grid_shape("img_size", img_size)


def check_seed(seed) -> int:
    return _checks.positive_int("seed", seed, allow_zero=True)


def check_train_augment(train_augment, split: str) -> str | Callable:
    """The train-split augmentation: ``None``, ``True`` or ``"default"``: the data set's standard
    one; ``False`` or ``"none"``: none; a callable: applied to the normalised train image tensor
    ``(C, H, W)`` (it must not change the label). Returns ``"default"``, ``"none"`` or the callable.

    The test split is never augmented: for ``split="test"`` the value is checked and returns "none".
    """
    if train_augment is None or train_augment is True:
        mode = "default"
    elif train_augment is False:
        mode = "none"
    elif callable(train_augment) or (isinstance(train_augment, str) and train_augment in AUGMENT_MODES):
        mode = train_augment
    else:
        raise ValueError(f"train_augment={train_augment!r}: expected None, True, False, one of "
                         f"{', '.join(map(repr, AUGMENT_MODES))}, or a callable taking and returning a "
                         "(C, H, W) tensor")
    return mode if split == "train" else "none"


def check_options(dataset: str, given: Mapping, defaults: Mapping) -> dict:
    """Merge data-set-specific options ``given`` over ``defaults``; an unknown one is an error."""
    for key, value in given.items():
        if key not in defaults:
            valid = ", ".join(sorted(defaults)) or "none"
            raise ValueError(f"unknown option {key}={value!r} for data set {dataset!r}; "
                             f"valid options: {valid}")
    return {**defaults, **given}
