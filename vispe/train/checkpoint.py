"""Checkpoints: written atomically, read back with a compatibility check.

A checkpoint is one file (``checkpoint.pt``) holding everything needed to continue exactly:

    {"format": 1, "encoding": "rope_mixed", "model_name": "vit_tiny", "config": {...resolved...},
     "model": state_dict, "optimizer": ..., "scheduler": ..., "scaler": ... | None,
     "rng": {"torch", "cuda", "numpy", "python"}, "progress": Progress as a dict}

``save`` writes ``<name>.tmp`` in the same folder, flushes it to disk, then renames it over the old
file (``os.replace`` is atomic), so a crash at any moment leaves either the old or the new
checkpoint, never half a file; a failed write (full disk, read-only folder) removes the temporary
file and raises ``logging.WriteError`` naming the file and the reason. Only plain types and tensors are stored, so ``load`` reads with
``torch.load(weights_only=True)``: a checkpoint cannot run code.

``check_compatible`` refuses, with a message that says what differs, a checkpoint written for
another encoding, another model or other parameter shapes.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from vispe.train.logging import write_atomically

FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit the model / config asked for."""


@dataclass
class Progress:
    """Where a run is: ``batch`` batches of epoch ``epoch`` are done (0 = the epoch has not started)."""

    epoch: int = 0
    batch: int = 0
    step: int = 0  # optimiser steps done in total
    epoch_sums: dict = field(default_factory=dict)  # running training sums of the current epoch
    history: list = field(default_factory=list)  # one dict of metrics per finished epoch
    elapsed_s: float = 0.0  # training time spent before this process started
    schedule: list = field(default_factory=list)  # the learning-rate plan's segments (vispe.train.schedule)


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
            "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    random.setstate(_as_tuples(state["python"]))


def _as_tuples(x):
    return tuple(_as_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model inside torch.compile and DistributedDataParallel wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def save(path: str | Path, *, model, optimizer, scheduler, scaler, progress: Progress, config: dict) -> None:
    """Write the checkpoint atomically (temporary file, fsync, rename)."""
    path = Path(path)
    state = {"format": FORMAT, "encoding": config["model"]["pe"], "model_name": config["model"]["name"],
             "config": config, "model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict() if scaler is not None else None,
             "rng": rng_state(), "progress": asdict(progress)}
    write_atomically(path, lambda f: torch.save(state, f))  # a full disk: WriteError, no .tmp left


def load(path: str | Path, map_location="cpu") -> dict:
    """Read a checkpoint; a missing, truncated or foreign file raises CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated zip, wrong format, foreign pickle...
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read (corrupt or truncated?): "
                              f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"checkpoint {str(path)!r} has format {got!r}: expected a vispe train.py "
                              f"checkpoint of format {FORMAT}")
    return state


def check_compatible(state: dict, model: torch.nn.Module, config: dict, path: str | Path = "checkpoint") -> None:
    """Refuse a checkpoint of another encoding, model or parameter shapes, saying what differs."""
    want_pe, want_model = config["model"]["pe"], config["model"]["name"]
    if state["encoding"] != want_pe:
        raise CheckpointError(f"checkpoint {str(path)!r} was written for encoding {state['encoding']!r}, "
                              f"but the config asks for model.pe={want_pe!r}")
    if state["model_name"] != want_model:
        raise CheckpointError(f"checkpoint {str(path)!r} was written for model {state['model_name']!r}, "
                              f"but the config asks for model.name={want_model!r}")
    own = unwrap(model).state_dict()
    saved = state["model"]
    missing = sorted(set(own) - set(saved))
    unexpected = sorted(set(saved) - set(own))
    shapes = [f"{k}: checkpoint {tuple(saved[k].shape)} vs model {tuple(own[k].shape)}"
              for k in sorted(set(own) & set(saved)) if saved[k].shape != own[k].shape]
    problems = ([f"missing in checkpoint: {', '.join(missing[:5])}"] if missing else []) + \
               ([f"not in model: {', '.join(unexpected[:5])}"] if unexpected else []) + shapes[:5]
    if len(shapes) > 5:
        problems.append(f"and {len(shapes) - 5} more shape differences")
    if problems:
        raise CheckpointError(f"checkpoint {str(path)!r} does not fit the model built from the config "
                              f"({want_model}, pe={want_pe}): " + "; ".join(problems))


def restore(state: dict, *, model, optimizer=None, scheduler=None, scaler=None) -> Progress:
    """Load the saved states into the objects given (after ``check_compatible``); returns the progress."""
    unwrap(model).load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"])
    return Progress(**state["progress"])
