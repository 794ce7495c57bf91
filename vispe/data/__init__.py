"""vispe.data: classification data sets by name.

    from vispe.data import build_dataset, dataset_info, available_datasets
    info = dataset_info("digits_cell", k=4)          # DatasetInfo(num_classes=16, in_chans=3, ...)
    ds = build_dataset("digits_cell", "train", img_size=48, seed=1, k=4)
    image, label = ds[0]                             # (3, 48, 48) float32 normalised, int

Every data set yields ``(image (C, H, W) float32 normalised with info.mean/std, int label)``.
``img_size=None`` is the native size; another size renders (embedded) or resizes (CIFAR) the
images with the same labels and the same normalisation. Data-set-specific options go in
``**kwargs`` (and to ``dataset_info`` likewise); an unknown one is a ValueError.

Names: ``digits_class``, ``digits_cell``, ``digits_relative``, ``digits_content_position``
(embedded, generated in memory: ``vispe.data.digits_canvas``; ``root`` must be None) and
``cifar10`` (``vispe.data.cifar10``; ``vispe.data.miniature`` writes a small copy for tests).
"""
from __future__ import annotations

import difflib
from collections.abc import Callable
from functools import partial

from vispe.data.cifar10 import build_cifar10, cifar10_info
from vispe.data.common import DatasetInfo
from vispe.data.digits_canvas import TASKS, DigitsCanvas, digits_info
from vispe.data.miniature import write_miniature_cifar10

__all__ = ["DatasetInfo", "available_datasets", "build_dataset", "dataset_info", "register_dataset",
           "write_miniature_cifar10"]

# name -> (info(**kwargs) -> DatasetInfo, build(split, *, root, img_size, seed, download, train_augment, **kwargs))
_DATASETS: dict[str, tuple[Callable, Callable]] = {}


def register_dataset(name: str, info: Callable, build: Callable) -> None:
    """Add a data set under ``name``; a duplicate name is an error."""
    if name in _DATASETS:
        raise ValueError(f"data set name {name!r} is already registered")
    _DATASETS[name] = (info, build)


def _build_digits(task: str, split, *, root, img_size, seed, download, train_augment, **kwargs):
    if root is not None:
        raise ValueError(f"root={root!r}: data set 'digits_{task}' is generated in memory and reads no "
                         "files; expected root=None")
    if not isinstance(download, bool):  # nothing to download: the permission is moot
        raise ValueError(f"download={download!r}: expected True or False")
    return DigitsCanvas(task, split, img_size=img_size, seed=seed, train_augment=train_augment, **kwargs)


for _task in TASKS:
    register_dataset(f"digits_{_task}", partial(digits_info, _task), partial(_build_digits, _task))
register_dataset("cifar10", cifar10_info, build_cifar10)


def _get(name: str) -> tuple[Callable, Callable]:
    if name not in _DATASETS:
        near = difflib.get_close_matches(str(name), list(_DATASETS), n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise ValueError(f"name={name!r}: unknown data set{hint}; expected one of {', '.join(available_datasets())}")
    return _DATASETS[name]


def available_datasets() -> list[str]:
    """Sorted names of the registered data sets."""
    return sorted(_DATASETS)


def dataset_info(name: str, **kwargs) -> DatasetInfo:
    """Classes, channels, native size, normalisation and class names of data set ``name``."""
    return _get(name)[0](**kwargs)


def build_dataset(name: str, split: str, *, root=None, img_size=None, seed: int = 0, download: bool = False,
                  train_augment=None, **kwargs):
    """Data set ``name``, ``split`` in {"train", "test"}, as a torch Dataset of (image, label).

    ``train_augment`` (train split only; the test split is never augmented): None / True /
    "default" (CIFAR: crop + flip; embedded: none), False / "none", or a callable on the
    normalised train tensor (it must keep the label: no flips on position tasks).
    """
    return _get(name)[1](split, root=root, img_size=img_size, seed=seed, download=download,
                         train_augment=train_augment, **kwargs)
