"""CIFAR-10 (Krizhevsky, "Learning Multiple Layers of Features from Tiny Images", 2009) through
torchvision's ``CIFAR10`` loader, with errors that name the folder or file at fault.

Layout expected under ``root`` (the Python version, cifar-10-python.tar.gz, extracted)::

    root/cifar-10-batches-py/data_batch_1 .. data_batch_5, test_batch, batches.meta

``root=None`` means ``$VISPE_DATA`` or else ``./data``. ``download=True`` fetches the archive when
a file the split needs is missing; a failed download is a FileNotFoundError saying how to do it
by hand.

Images: 32x32 RGB, 50,000 train / 10,000 test, 10 classes. Transforms (torchvision v2):

* train: ``[Resize(img_size)] -> RandomCrop(img_size, padding=4 * img_size / 32) ->
  RandomHorizontalFlip -> float in [0, 1] -> Normalize(MEAN, STD)`` (the standard recipe at 32);
  ``train_augment="none"`` (or False) drops the crop and flip; a callable replaces them and is
  applied to the normalised tensor ``(3, H, W)``.
* test: ``[Resize(img_size)] -> float in [0, 1] -> Normalize(MEAN, STD)``.

``MEAN`` / ``STD`` are the per-channel statistics of the 50,000 training images (std over all
pixels, 0.247/0.243/0.261; the often-quoted 0.2023/0.1994/0.2010 is a per-image average).

Integrity: torchvision compares every file with the official MD5 and on any mismatch says only
"Dataset not found or corrupted". ``CheckedCIFAR10`` (torchvision's class, whose loading code
runs unchanged) does the MD5 check itself and names the file that fails (``verify_md5=True``,
the default), or skips only that comparison (``verify_md5=False``): a miniature set written by
``vispe.data.miniature`` has the real format but not the official bytes. A file that cannot be
read as a CIFAR batch (truncated, corrupt, wrong fields) is a ValueError naming it, either way.
The ``seed`` argument has no effect here: the data are fixed and augmentation draws from torch's
generator (seed it with ``torch.manual_seed`` / the DataLoader's ``generator``).
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch
from torchvision.datasets import CIFAR10, utils as tv_utils
from torchvision.transforms import v2

from vispe.data.common import DatasetInfo, check_img_size, check_options, check_seed, check_split, check_train_augment

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
FOLDER = CIFAR10.base_folder  # "cifar-10-batches-py"
TRAIN_FILES = tuple(name for name, _ in CIFAR10.train_list)  # data_batch_1 .. data_batch_5
TEST_FILES = tuple(name for name, _ in CIFAR10.test_list)  # test_batch
META_FILE = CIFAR10.meta["filename"]  # batches.meta
OFFICIAL_MD5 = {**dict(CIFAR10.train_list), **dict(CIFAR10.test_list), META_FILE: CIFAR10.meta["md5"]}
_OPTIONS = dict(verify_md5=True)


def default_root() -> Path:
    return Path(os.environ.get("VISPE_DATA", "data"))


def _layout(root: Path, download: bool) -> str:
    how = ("download=True did not produce it (is the archive's top folder renamed? is the disk full?)"
           if download else "pass download=True to download it there")
    return (f"expected {root / FOLDER}/ holding {', '.join(TRAIN_FILES + TEST_FILES)} and {META_FILE} "
            f"(the Python version of CIFAR-10: extract {CIFAR10.url} into {root}); {how}")


def cifar10_info(**kwargs) -> DatasetInfo:
    check_options("cifar10", kwargs, _OPTIONS)
    return DatasetInfo(num_classes=10, in_chans=3, img_size=32, mean=MEAN, std=STD, class_names=CLASS_NAMES)


def _ensure_files(root: Path, names: tuple[str, ...], download: bool) -> None:
    """Download when asked and a needed file is missing; then every needed file must exist."""
    folder = root / FOLDER
    if download and not all((folder / n).is_file() for n in names):
        try:
            tv_utils.download_and_extract_archive(CIFAR10.url, str(root), filename=CIFAR10.filename,
                                                  md5=CIFAR10.tgz_md5)
        except (OSError, RuntimeError, ValueError) as err:
            raise FileNotFoundError(f"CIFAR-10 download into {root} failed ({type(err).__name__}: {err}); "
                                    f"download it by hand: expected {root / FOLDER}/ holding "
                                    f"{', '.join(TRAIN_FILES + TEST_FILES)} and {META_FILE} "
                                    f"(extract {CIFAR10.url} into {root})") from err
    if not folder.is_dir():
        raise FileNotFoundError(f"CIFAR-10 folder {folder} not found: {_layout(root, download)}")
    for name in names:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"CIFAR-10 file {folder / name} not found: {_layout(root, download)}")


def _verify_md5(root: Path, names: tuple[str, ...]) -> None:
    for name in names:
        path = root / FOLDER / name
        if not tv_utils.check_md5(str(path), OFFICIAL_MD5[name]):
            raise ValueError(f"CIFAR-10 file {path}: its MD5 is not the official one ({OFFICIAL_MD5[name]}). "
                             f"If it is corrupt or truncated, delete {root / FOLDER} and download again "
                             "(download=True); if it is a miniature or self-made set in the CIFAR format, "
                             "pass verify_md5=False")


def file_problem(path: Path) -> str | None:
    """Why ``path`` is not a readable CIFAR-10 batch (or ``batches.meta``), or None if it is."""
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f, encoding="latin1")  # as torchvision reads it
    except Exception as err:  # noqa: BLE001 - any failure to unpickle is reported with the file
        return f"cannot be unpickled ({type(err).__name__}: {err}); it may be truncated or corrupt"
    if not isinstance(entry, dict):
        return f"holds a {type(entry).__name__}, expected a dict"
    if path.name == META_FILE:
        names = entry.get(CIFAR10.meta["key"])
        return None if isinstance(names, list) and len(names) == 10 else "has no list of 10 'label_names'"
    data, labels = entry.get("data"), entry.get("labels")
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == 3072):
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        return f"has 'data' {got}, expected a uint8 array (N, 3072)"
    if not isinstance(labels, list) or len(labels) != len(data):
        return f"has 'labels' that are not a list of {len(data)} ints"
    if not all(isinstance(v, (int, np.integer)) and 0 <= v < 10 for v in labels):
        return "has 'labels' outside 0..9"
    return None


def _raise_for_bad_file(root: Path, names: tuple[str, ...], err: Exception | None) -> None:
    """Raise a ValueError naming the first of ``names`` that is not a readable CIFAR-10 file."""
    for name in names:
        problem = file_problem(root / FOLDER / name)
        if problem:
            raise ValueError(f"CIFAR-10 file {root / FOLDER / name} {problem}") from err


class CheckedCIFAR10(CIFAR10):
    """torchvision's ``CIFAR10`` with named errors and an optional MD5 check (see module doc)."""

    def __init__(self, root, train: bool = True, transform=None, *, download: bool = False,
                 verify_md5: bool = True) -> None:
        root = Path(root).expanduser()
        names = (TRAIN_FILES if train else TEST_FILES) + (META_FILE,)
        _ensure_files(root, names, download)
        if verify_md5:
            _verify_md5(root, names)
        # The checks above replace torchvision's MD5 checks (its _check_integrity and _load_meta).
        self.meta = {**CIFAR10.meta, "md5": None}
        try:
            super().__init__(str(root), train=train, transform=transform, download=False)
        except Exception as err:
            _raise_for_bad_file(root, names, err)
            raise
        targets = np.asarray(self.targets)  # torchvision does not check the labels
        if len(targets) != len(self.data) or not ((targets >= 0) & (targets < 10)).all():
            _raise_for_bad_file(root, names, None)

    def _check_integrity(self) -> bool:
        # Presence only: the MD5s were checked (or skipped on purpose) in __init__, naming the file.
        files = self.train_list if self.train else self.test_list
        return all(os.path.isfile(os.path.join(self.root, self.base_folder, n)) for n, _ in files)


def cifar10_transform(split: str, img_size: tuple[int, int], augment) -> v2.Compose:
    """The transform of ``split`` at ``img_size`` (h, w); ``augment`` as ``check_train_augment`` returns."""
    h, w = img_size
    ops = [] if (h, w) == (32, 32) else [v2.Resize((h, w), antialias=True)]
    if split == "train" and augment == "default":
        ops += [v2.RandomCrop((h, w), padding=[round(4 * w / 32), round(4 * h / 32)]), v2.RandomHorizontalFlip()]
    ops += [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    if callable(augment):
        ops.append(augment)
    return v2.Compose(ops)


def build_cifar10(split: str, *, root=None, img_size=None, seed: int = 0, download: bool = False,
                  train_augment=None, **kwargs) -> CheckedCIFAR10:
    """CIFAR-10 ``split`` yielding ``(image (3, H, W) float32 normalised, label int)``."""
    split = check_split(split)
    opts = check_options("cifar10", kwargs, _OPTIONS)
    if not isinstance(opts["verify_md5"], bool):
        raise ValueError(f"verify_md5={opts['verify_md5']!r}: expected True or False")
    if not isinstance(download, bool):
        raise ValueError(f"download={download!r}: expected True or False")
    check_seed(seed)
    if root is not None and not isinstance(root, (str, os.PathLike)):
        raise ValueError(f"root={root!r}: expected a folder path (str or os.PathLike) or None")
    transform = cifar10_transform(split, check_img_size(img_size, 32), check_train_augment(train_augment, split))
    ds = CheckedCIFAR10(default_root() if root is None else root, train=split == "train", transform=transform,
                        download=download, verify_md5=opts["verify_md5"])
    ds.info = cifar10_info(**kwargs)
    return ds
