"""A full disk or an unwritable run folder (issue 19, item 3): ``train.py: error:`` naming the
folder and the cause, no partial ``.tmp`` file left behind, the last good checkpoint and the logs
kept. The write errors are injected (a file object that fills up, as a full disk does, under the
real ``torch.save``), and a read-only ``out_dir`` is made with chmod, or simulated when the tests
run as root (for whom chmod does not stop writes)."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from conftest import load_train_main
from vispe.train import logging as L

TINY = ["data.kwargs.n_train=48", "data.kwargs.n_test=16", "data.batch_size=16", "model.embed_dim=32",
        "model.num_heads=2", "model.depth=1", "train.eval_sizes=[1.0]", "train.progress=false",
        "train.compare=[]"]
ENOSPC = os.strerror(errno.ENOSPC)  # "No space left on device"
main = load_train_main()


class _FillingFile:
    """Wraps a binary file; writes fail with ENOSPC once ``room`` bytes are written."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, b):
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, ENOSPC)
        self.room -= len(b)
        return self.f.write(b)

    def flush(self):
        self.f.flush()


def test_full_disk_at_a_checkpoint_is_a_clear_error_and_keeps_the_last_one(tmp_path, capsys, monkeypatch):
    real_save, calls = torch.save, []

    def save(obj, f, *args, **kwargs):  # the third checkpoint hits a full disk after 2 kB
        calls.append(1)
        return real_save(obj, f if len(calls) < 3 else _FillingFile(f, 2048), *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    rc = main([f"train.out_dir={tmp_path}", *TINY, "train.epochs=2", "train.ckpt_every_steps=1"])
    err = capsys.readouterr().err
    sub = tmp_path / "default" / "learned_abs"
    assert rc == 1, err
    assert err.startswith("train.py: error: ") and "Traceback" not in err
    assert str(sub) in err and ENOSPC in err and "--resume" in err, err
    assert not list(tmp_path.rglob("*.tmp")), "a partial temporary file was left behind"
    monkeypatch.setattr(torch, "save", real_save)
    state = torch.load(sub / "checkpoint.pt", weights_only=True)  # the last good one, intact
    assert state["progress"]["step"] == 2
    assert (sub / "config.yaml").is_file() and list((sub / "tb").iterdir())  # logs kept


def _read_only(folder: Path, monkeypatch) -> None:
    """Make ``folder`` read-only; as root (chmod does not stop root) simulate it for train.py."""
    folder.mkdir()
    folder.chmod(0o555)
    probe = folder / "probe"
    try:
        probe.write_text("")
    except PermissionError:
        return
    probe.unlink()
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if folder in Path(self).absolute().parents:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)


def test_read_only_out_dir_is_a_clear_error(tmp_path, capsys, monkeypatch):
    out = tmp_path / "ro"
    _read_only(out, monkeypatch)
    try:
        rc = main([f"train.out_dir={out}", *TINY, "train.epochs=1"])
    finally:
        out.chmod(0o755)
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.startswith("train.py: error: ") and "Traceback" not in err
    assert str(out / "default") in err and os.strerror(errno.EACCES) in err, err
    assert not list(out.iterdir())


def test_atomic_write_on_a_full_disk_removes_its_temporary_file_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "metrics.csv"
    target.write_text("old\n")
    real_open = open

    class FullFile(_FillingFile):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def fileno(self):
            return self.f.fileno()

    def full_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return FullFile(f, 3) if "w" in mode else f

    monkeypatch.setattr("builtins.open", full_open)
    with pytest.raises(L.WriteError, match=f"cannot write {tmp_path / 'metrics.csv'}: {ENOSPC}"):
        L.atomic_write(target, "new content\n")
    monkeypatch.undo()
    assert target.read_text() == "old\n" and not list(tmp_path.glob("*.tmp"))
