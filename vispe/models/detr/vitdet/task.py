"""The ViT detectors in train.py: ``detr.decoder: rfdetr | lwdetr`` (``configs/shapes_rfdetr*.yaml``).

``from_train_config(num_classes, cfg)`` builds the detector from the config: the shared ``detr.*`` keys
it reads (``num_queries``, ``d_model``, ``nheads`` = the cross-attention's heads, ``dec_layers``,
``dim_feedforward``, ``dropout``, ``aux_loss``, ``n_points``), ``detr.decoder_kwargs`` for the rest
(``create_vit_detr``'s arguments: ``embed_dim``, ``depth``, ``num_windows``, ``groups``, ``mask_aware``,
...), and the position from ``model.pe``: ``learned_abs`` is the backbone's table (resampled at every
size), any rotary or bias encoding (``rope_mixed``, ...) replaces it, ``none`` gives no position. A
``detr.*`` key it does not read must keep its default (a ValueError names it).

``GroupCriterion``: Group DETR's loss, the set criterion on each group of queries apart (one-to-one
matching within a group) averaged over the groups; the two-stage predictions are grouped the same way.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vispe.models.detr.vitdet.build import create_vit_detr
from vispe.models.detr.vitdet.model import ViTDETR

DECODERS = ("rfdetr", "lwdetr")
#: detr.* keys read, by create_vit_detr argument
READ = {"num_queries": "num_queries", "d_model": "d_model", "nheads": "cross_heads", "dec_layers": "dec_layers",
        "dim_feedforward": "dim_feedforward", "dropout": "dropout", "aux_loss": "aux_loss", "n_points": "num_points"}


def from_train_config(num_classes: int, pe: str, detr: dict[str, Any], defaults: dict[str, Any]) -> ViTDETR:
    """The detector of a train.py config (module docstring): ``pe`` = ``model.pe``, ``detr`` the ``detr.*``
    keys, ``defaults`` their schema defaults."""
    ignored = sorted(k for k, v in detr.items()
                     if k not in READ and k not in ("decoder", "decoder_kwargs") and v != defaults.get(k))
    if ignored:
        raise ValueError(f"config keys {['detr.' + k for k in ignored]}: detr.decoder={detr['decoder']!r} does not read "
                         "them (set the ViT detector's options in detr.decoder_kwargs)")
    kw: dict[str, Any] = {READ[k]: detr[k] for k in READ if detr.get(k) is not None}
    kw.update(detr.get("decoder_kwargs") or {})
    if pe == "learned_abs":
        kw.setdefault("table_grid", 8)
    elif pe == "none":
        kw["table_grid"] = None
    else:
        kw["table_grid"], kw["encoding"] = None, pe
    return create_vit_detr(flavour=detr["decoder"], num_classes=num_classes, **kw)


def _stack_groups(out: dict[str, Any], G: int) -> dict[str, Any]:
    """(B, G*Q, .) predictions as (G*B, Q, .): group g of image b at row g*B + b."""
    def fold(t: torch.Tensor) -> torch.Tensor:
        B, GQ = t.shape[:2]
        return t.reshape(B, G, GQ // G, *t.shape[2:]).transpose(0, 1).reshape(G * B, GQ // G, *t.shape[2:])

    part = {k: (fold(v) if k in ("pred_logits", "pred_boxes") else v) for k, v in out.items()
            if k not in ("aux_outputs", "enc_outputs", "groups")}
    if "aux_outputs" in out:
        part["aux_outputs"] = [_stack_groups(a, G) for a in out["aux_outputs"]]
    if "enc_outputs" in out:
        part["enc_outputs"] = _stack_groups(out["enc_outputs"], G)
    return part


class GroupCriterion(nn.Module):
    """``criterion`` on each group apart, averaged (module docstring). The G groups are scored in one call,
    as G copies of the batch (each group matched to its own copy of the targets), so the loss is the
    groups' mean exactly when the batch has a box (with none, the criterion's box count is clamped to 1 and
    the groups' losses add up instead)."""

    def __init__(self, criterion: nn.Module) -> None:
        super().__init__()
        self.criterion = criterion

    def forward(self, outputs: dict[str, Any], targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        G = outputs.get("groups", 1)
        if G == 1:
            return self.criterion({k: v for k, v in outputs.items() if k != "groups"}, targets)
        return self.criterion(_stack_groups(outputs, G), [t for _ in range(G) for t in targets])

    def __getattr__(self, name: str) -> Any:  # the wrapped criterion's attributes (num_classes, weights, ...)
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("criterion"), name)

