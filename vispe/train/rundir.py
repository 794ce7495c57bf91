"""The run folder ``<train.out_dir>/<train.run_name>/`` and the rules that keep it safe.

Layout (one invocation of train.py = one run folder; one sub-folder per encoding trained):

    runs/default/
        config.yaml          the resolved config of the invocation
        summary.json         final metrics of every encoding, "finished": true once all are done
        comparison.md        the comparison table printed at the end
        comparison.png       test accuracy against the epoch, one line per encoding
        learned_abs/         one encoding's run: config.yaml, checkpoint.pt, metrics.csv,
        none/                tb/ (TensorBoard events), curves.png, summary.json

Rules (nothing written is ever lost or overwritten silently):

* a new run needs a folder that holds no run (no checkpoint, summary, metrics or events);
* except a smoke run (``--smoke``): a folder that holds a smoke run (marked by the ``SMOKE_MARKER``
  file its run wrote) is replaced by the new smoke run; a smoke run is never written over a real
  run's folder;
* a folder holding a run (finished or not) is refused unless ``--resume`` is given (continue it) or
  ``train.overwrite=true`` (the old folder is renamed ``<name>.bak-<date-time>``, not deleted);
* ``--resume`` with ``train.overwrite=true`` is refused (they contradict each other);
* ``--resume`` with nothing to resume starts a new run and says so (one command for first start and
  restarts, as on preemptible machines);
* ``--resume`` with a config that differs from the stored one in anything but ``RESUMABLE_KEYS``
  (epochs, device, compile, logging...) is refused, naming the keys that differ.
"""
from __future__ import annotations

import copy
import json
import shutil
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vispe.train import config as C
from vispe.train.logging import atomic_write, write_error

#: file a smoke run leaves in its run folder: the next smoke run may replace the folder
SMOKE_MARKER = ".vispe-smoke-run"


class RunFolderError(ValueError):
    """The run folder cannot be used as asked; the message says why and what to do."""


def run_dir(cfg: DictConfig) -> Path:
    return Path(cfg.train.out_dir) / cfg.train.run_name


def state(path: Path) -> str:
    """``"empty"`` (no run), ``"finished"`` (summary.json says so) or ``"unfinished"``."""
    if not path.exists():
        return "empty"
    if not path.is_dir():
        raise RunFolderError(f"run folder {str(path)!r} exists and is not a folder")
    summary = path / "summary.json"
    if summary.is_file():
        try:
            if json.loads(summary.read_text()).get("finished"):
                return "finished"
        except (OSError, ValueError):
            pass
    traces = ("*/checkpoint.pt", "*/summary.json", "*/metrics.csv", "*/tb/*")  # any log or checkpoint
    if summary.exists() or any(any(path.glob(t)) for t in traces):
        return "unfinished"
    return "empty"


def plan(cfg: DictConfig, *, resume: bool, smoke: bool = False) -> tuple[str, list[str]]:
    """Decide what to do with the run folder (read-only; every rank can call it).

    Returns ``(action, notes)`` with action ``"new"``, ``"resume"``, ``"backup"`` or ``"replace"``
    (a smoke run over a previous smoke run).
    """
    path = run_dir(cfg)
    if resume and cfg.train.overwrite:
        raise RunFolderError("--resume and train.overwrite=true contradict each other: continue the run "
                             "(--resume) or move it aside and start again (train.overwrite=true)")
    st = state(path)
    if st == "empty":
        notes = [f"nothing to resume in {path}: starting a new run"] if resume else []
        return "new", notes
    if not resume:
        if cfg.train.overwrite:
            return "backup", [f"train.overwrite=true: moving the existing run {path} aside"]
        if smoke and (path / SMOKE_MARKER).is_file():
            return "replace", [f"--smoke: replacing the previous smoke run in {path}"]
        extra = " (not a smoke run, so --smoke does not replace it)" if smoke else ""
        raise RunFolderError(
            f"run folder {str(path)!r} already holds a{' finished' if st == 'finished' else 'n unfinished'} run{extra}. "
            f"Pass --resume to continue it, set train.run_name=<new name> for a new run, or "
            f"train.overwrite=true to move the old folder aside to {path.name}.bak-<date-time> (nothing is deleted)")
    stored_path = path / "config.yaml"
    if stored_path.is_file():
        stored = C.load_config(stored_path)
        changed = {k: v for k, v in C.diff(stored, cfg).items() if k not in C.RESUMABLE_KEYS}
        if changed:
            what = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in ((k, *v) for k, v in changed.items()))
            raise RunFolderError(f"--resume: the config differs from the one stored in {stored_path} in keys that "
                                 f"change what is trained ({what}). Resume with the stored config "
                                 f"(--config {stored_path} --resume) or start a new run (train.run_name=...)")
        allowed = {k: v for k, v in C.diff(stored, cfg).items() if k in C.RESUMABLE_KEYS}
        notes = [f"--resume: {k} changed from {a!r} to {b!r}" for k, (a, b) in allowed.items()]
        return "resume", notes
    return "resume", []


def execute(cfg: DictConfig, action: str, *, smoke: bool = False) -> Path:
    """Carry out ``plan``'s action (rank 0 only) and write the resolved config."""
    path = run_dir(cfg)
    try:
        return _execute(cfg, action, path, smoke)
    except OSError as e:  # a read-only out_dir, a full disk
        raise write_error(path, e) from e


def _execute(cfg: DictConfig, action: str, path: Path, smoke: bool) -> Path:
    if action == "replace":  # only ever a previous smoke run's folder (plan checked its marker)
        shutil.rmtree(path)
    if action == "backup":
        backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
        n = 1
        while backup.exists():
            backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
            n += 1
        path.rename(backup)
        print(f"moved the previous run to {backup}", flush=True)
    path.mkdir(parents=True, exist_ok=True)
    if smoke and action != "resume":
        (path / SMOKE_MARKER).write_text("written by train.py --smoke: the next smoke run may replace this folder\n")
    stored = copy.deepcopy(cfg)
    stored.train.overwrite = False  # done once; the stored config must resume, not move the run aside
    atomic_write(path / "config.yaml", C.to_yaml(stored))
    return path


def encoding_dir(path: Path, pe: str) -> Path:
    return path / pe


def finished_summary(sub: Path, epochs: int) -> dict | None:
    """The summary of a finished encoding run of at least ``epochs`` epochs, else None."""
    f = sub / "summary.json"
    if not f.is_file():
        return None
    try:
        summary = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return summary if summary.get("finished") and summary.get("epochs", 0) >= epochs else None


def write_config(sub: Path, cfg: DictConfig) -> None:
    """The resolved config of one encoding's run, in its folder."""
    try:
        sub.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(sub, e) from e
    stored = copy.deepcopy(cfg)
    stored.train.overwrite = False
    atomic_write(sub / "config.yaml", OmegaConf.to_yaml(stored, resolve=True))
