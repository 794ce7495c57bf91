"""A miniature CIFAR-10 in the real on-disk format, for tests and demos (no download).

``write_miniature_cifar10(root)`` writes ``root/cifar-10-batches-py/`` with ``data_batch_1`` ..
``data_batch_5``, ``test_batch`` and ``batches.meta``, each a pickled dict exactly like the
official files (written by Python 2): keys ``batch_label``, ``labels``, ``data``, ``filenames``
(meta: ``num_cases_per_batch``, ``label_names``, ``num_vis``). ``data`` is uint8 ``(N, 3072)``:
per image the 1024 red, then green, then blue values, each plane row-major; ``labels`` a list
of ints in 0..9.

The official files hold Python 2 ``str`` objects, which Python 3 reads back as ``str`` under
``pickle.load(f, encoding="latin1")`` (torchvision: ``entry["data"]``) and as ``bytes`` under
``encoding="bytes"`` (the CIFAR web page's recipe: ``d[b"data"]``). Python 3 has no such type,
so strings are written here with the Python 2 opcodes (``SHORT_BINSTRING`` / ``BINSTRING``) and
both readings work as on the real files.

Images are learnable on purpose: each class has a fixed random 4x4 colour layout (upsampled to
32x32) and each image is that layout plus uniform noise, so a demo run can fit it. The MD5s are
not the official ones: load with ``build_dataset("cifar10", ..., verify_md5=False)``.
"""
from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np

from vispe import _checks
from vispe.data.cifar10 import CLASS_NAMES, FOLDER, META_FILE, TEST_FILES, TRAIN_FILES


class _Py2Str(bytes):
    """A Python 2 ``str`` (a byte string that Python 3 unpickles as ``str`` with encoding="latin1")."""


class _Py2Pickler(pickle._Pickler):  # the pure-Python pickler: its dispatch table can be extended
    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: _Py2Str) -> None:
        n = len(obj)
        head = pickle.SHORT_BINSTRING + bytes([n]) if n < 256 else pickle.BINSTRING + struct.pack("<i", n)
        self.write(head + bytes(obj))
        self.memoize(obj)

    dispatch[_Py2Str] = save_py2_str


def _s(text: str) -> _Py2Str:
    return _Py2Str(text.encode("latin1"))


def _dump(obj, path: Path) -> None:
    with open(path, "wb") as f:
        _Py2Pickler(f, protocol=2).dump(obj)


def _class_layouts(rng) -> np.ndarray:
    """One random colour layout per class: 4x4 cells of 8x8 pixels -> (10, 3, 32, 32) in [0, 1]."""
    cells = rng.random((10, 3, 4, 4))  # (10, 3, 4, 4)
    return cells.repeat(8, axis=2).repeat(8, axis=3)  # (10, 3, 32, 32)


def write_miniature_cifar10(root, n_per_batch: int = 20, seed: int = 0) -> Path:
    """Write a miniature CIFAR-10 (``n_per_batch`` images per batch file) under ``root``.

    Returns the folder ``root/cifar-10-batches-py``. Labels are balanced within each batch
    (``n_per_batch`` >= 10 puts every class in every file). Deterministic given ``seed``.
    """
    n = _checks.positive_int("n_per_batch", n_per_batch)
    rng = np.random.default_rng(_checks.positive_int("seed", seed, allow_zero=True))
    folder = Path(root).expanduser() / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    layouts = _class_layouts(rng)  # (10, 3, 32, 32)
    titles = [f"training batch {i + 1} of {len(TRAIN_FILES)}" for i in range(len(TRAIN_FILES))]
    titles += [f"testing batch {i + 1} of {len(TEST_FILES)}" for i in range(len(TEST_FILES))]
    for b, (name, title) in enumerate(zip(TRAIN_FILES + TEST_FILES, titles)):
        labels = rng.permutation(np.arange(n) % 10)  # (n,)
        pixels = 0.6 * layouts[labels] + 0.4 * rng.random((n, 3, 32, 32))  # (n, 3, 32, 32)
        data = np.round(pixels * 255).astype(np.uint8).reshape(n, 3072)  # (n, 3072): R, G, B planes
        filenames = [_s(f"{CLASS_NAMES[y]}_s_{b * n + i:06d}.png") for i, y in enumerate(labels)]
        entry = {_s("batch_label"): _s(title), _s("labels"): labels.tolist(), _s("data"): data,
                 _s("filenames"): filenames}
        _dump(entry, folder / name)
    meta = {_s("num_cases_per_batch"): n, _s("label_names"): [_s(c) for c in CLASS_NAMES], _s("num_vis"): 3072}
    _dump(meta, folder / META_FILE)
    return folder
