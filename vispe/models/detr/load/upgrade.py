"""Checkpoints written by earlier vispe versions, brought to today's ``create_detr``: one rule per change, each
with its reason, applied to a saved ``model.config`` (``upgrade_config``) before the model is rebuilt.

| rule | since | what an older config means today |
|---|---|---|
| DAB on the deformable operator | issue 46 | ``decoder="dab", attention="deformable"`` became DINO's query formulation (learned content ``tgt_embed``, heads shared by the layers, the decoder norm); ``model.config`` now records ``decoder_kwargs["formulation"]`` ("dino"), so a config without it was built before, with zero content, one head per layer under refinement and no decoder norm: ``formulation="legacy"`` rebuilds exactly that |
| sizes by attention | issue 46 | ``num_queries`` / ``dim_feedforward`` / ``decoder`` default to the paper of the attention (300 / 1024 / "deformable" with deformable attention); older configs store the values they were built with, so nothing changes |

``load_detr`` applies it to vispe's own checkpoints (``{"config": model.config, "model": state_dict}``);
``tests/test_detr_compat.py`` loads files written before issue 46 and compares their outputs bit for bit.
"""
from __future__ import annotations


def _dab_on_deformable(config: dict) -> bool:
    return config.get("attention") == "deformable" and config.get("decoder") == "dab"


def upgrade_config(config: dict) -> dict:
    """``config`` (a saved ``model.config``) with the rules of the module docstring applied; a copy."""
    config = dict(config)
    if _dab_on_deformable(config) and "formulation" not in (config.get("decoder_kwargs") or {}):
        config["decoder_kwargs"] = {**(config.get("decoder_kwargs") or {}), "formulation": "legacy"}
    return config


def resolved_decoder_kwargs(queries, decoder_kwargs: dict | None) -> dict:
    """``decoder_kwargs`` as ``model.config`` records them: with DAB on the deformable operator, the
    formulation it was built with, so that ``upgrade_config`` can tell today's configs from older ones."""
    kw = dict(decoder_kwargs or {})
    formulation = getattr(queries, "formulation", None)
    if formulation is not None:
        kw.setdefault("formulation", formulation)
    return kw


def is_vispe_checkpoint(source) -> bool:
    """Whether ``source`` is vispe's own ``{"config": model.config, "model": state_dict}``."""
    return (isinstance(source, dict) and isinstance(source.get("config"), dict) and isinstance(source.get("model"), dict)
            and "num_classes" in source["config"] and "pe" in source["config"])
