"""Trained models for the analysis figures: from a train.py run folder, or from a small weights file.

    model, cfg = load_run_model("runs/sweeps/digits_cell/learned_abs_seed0/learned_abs")
    export_weights("runs/sweeps/digits_cell/learned_abs_seed0/learned_abs", "results/compare/models/x.pt")
    model, cfg = load_weights("results/compare/models/x.pt")

A weights file holds the run's resolved config and the model's state_dict in float16 (a vit_pico is
about 0.3 MB), so that committed figures of trained encodings can be redrawn from a fresh clone.
"""
from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

WEIGHTS_FORMAT = "vispe-weights-1"


def _build(config: dict) -> torch.nn.Module:
    """The model of a resolved train.py config (no data set is built: only its info)."""
    from vispe.train.tasks import get_task

    cfg = OmegaConf.create(config)
    task = get_task(cfg.task)
    info = task.info(cfg)
    return task.model(cfg, info, cfg.data.img_size or info.img_size)


def load_run_model(encoding_dir: str | Path):
    """(model in eval mode, config dict) from ``<run>/<encoding>/`` (its checkpoint.pt)."""
    from vispe.train import checkpoint as ckpt

    path = Path(encoding_dir) / "checkpoint.pt"
    state = ckpt.load(path)
    model = _build(state["config"])
    ckpt.check_compatible(state, model, state["config"], path)
    model.load_state_dict(state["model"])
    return model.eval(), state["config"]


def export_weights(encoding_dir: str | Path, out: str | Path) -> Path:
    """Write the config and the float16 state_dict of a finished run's model to ``out``."""
    model, config = load_run_model(encoding_dir)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sd = {k: (v.half() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
    torch.save({"format": WEIGHTS_FORMAT, "config": config, "model": sd}, out)
    return out


def load_weights(path: str | Path):
    """(model in eval mode, float32, config dict) from a file written by ``export_weights``."""
    state = torch.load(Path(path), map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != WEIGHTS_FORMAT:
        raise ValueError(f"{str(path)!r}: expected a file written by vispe.analysis.trained.export_weights")
    model = _build(state["config"])
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state["model"].items()})
    return model.eval(), state["config"]
