"""DINO's query source and decoder loop as one module, for a detector to call (Zhang et al., ICLR 2023).

``DinoDecoding`` owns DINO's own parameters -- ``label_enc`` (the denoising groups' label embedding,
``num_classes + 1`` rows as the reference's ``dn_labelbook_size + 1``), ``selection``
(``MixedQuerySelection``: ``enc_output``, ``enc_output_norm``, ``tgt_embed``), ``query_pos``
(``DinoQueryPos``: ``ref_point_head`` of the anchor code) and the decoder's final ``norm`` -- and
runs, given the detector's encoder memory, decoder layers and heads::

    proposals of the memory -> mixed query selection: Q anchors (boxes), Q learned contents
    [training, with targets, dn_number > 0] + denoising groups in front, and their attention mask
    decoder loop with look-forward-twice (or once): layer i samples around the detached boxes
    heads per layer -> dn_post_process: matching outputs, denoising outputs

``forward`` returns DETR's output dict (``pred_logits``, ``pred_boxes``, ``aux_outputs``) plus
``interm_outputs`` (the selected proposals' predictions: the set loss with the true classes, DINO's
``_interm`` terms) and, when there are denoising groups, ``dn_outputs`` and ``dn_meta``
({"num_groups", "single_pad"}) for ``denoising_losses``. In eval the targets are not read.

DDP: every parameter takes part in every forward (``label_enc`` through a zero-weighted term when
there are no groups, as the reference's ``hs[0] += label_enc.weight[0, 0] * 0``).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vispe.models.detr.queries.dn.groups import check_options, prepare_cdn
from vispe.models.detr.queries.dn.lookahead import layer_boxes, look_forward_twice
from vispe.models.detr.queries.dn.query_pos import DinoQueryPos
from vispe.models.detr.queries.dn.selection import MixedQuerySelection
from vispe.models.detr.queries.dn.split import dn_post_process

#: the options of ``DinoDecoding``, with DINO's values (the detector's strategy: ``vispe.models.detr.queries.dino``)
DEFAULTS = dict(dn_number=100, dn_box_noise_scale=1.0, dn_label_noise_ratio=0.5, look_forward_twice=True,
                select="valid")

#: one decoder layer: (index, queries (B, T, d), detached boxes (B, T, 4), self-attention mask (T, T) bool,
#: True = may attend, or None) -> (B, T, d)
Layer = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


class DinoDecoding(nn.Module):
    """DINO's queries and decoder loop (module docstring). ``anchor_pe``: the anchors' additive code
    (``vispe.models.detr.queries.positioned.build_anchor_pe``; "sine" is DINO's)."""

    def __init__(self, d_model: int, num_queries: int, num_classes: int, anchor_pe: nn.Module, *,
                 dn_number: int = 100, dn_box_noise_scale: float = 1.0, dn_label_noise_ratio: float = 0.5,
                 look_forward_twice: bool = True, select: str = "valid") -> None:
        super().__init__()
        if isinstance(dn_number, bool) or not isinstance(dn_number, int) or dn_number < 0:
            raise ValueError(f"dn_number={dn_number!r}: expected a non-negative integer (0: no denoising; DINO: 100)")
        if not isinstance(look_forward_twice, bool):
            raise ValueError(f"look_forward_twice={look_forward_twice!r}: expected True or False")
        if dn_number:  # the noise options, checked at build
            check_options(dn_number, dn_label_noise_ratio, dn_box_noise_scale)
        self.d_model, self.num_queries, self.num_classes = d_model, num_queries, num_classes
        self.dn_number, self.box_noise, self.label_noise = dn_number, dn_box_noise_scale, dn_label_noise_ratio
        self.look_twice = look_forward_twice
        self.label_enc = nn.Embedding(num_classes + 1, d_model) if dn_number else None
        self.selection = MixedQuerySelection(d_model, num_queries, select=select)
        self.query_pos = DinoQueryPos(d_model, anchor_pe)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, memory: torch.Tensor, proposals: torch.Tensor, zeroed: torch.Tensor, layer: Layer,
                num_layers: int, class_heads, box_heads, enc_heads: tuple[nn.Module, nn.Module],
                targets: list[dict] | None = None, *, aux_loss: bool = True,
                generator: torch.Generator | None = None) -> dict:
        """``memory`` (B, N, d) the encoder's output, ``zeroed`` / ``proposals`` (B, N, d) / (B, N, 4) its
        proposals (``encoder_proposals``), ``layer`` the decoder layer call, ``class_heads[i]`` /
        ``box_heads[i]`` layer i's heads, ``enc_heads`` (class, box) of the proposals -> the output dict
        (module docstring)."""
        content, anchors, interm = self.selection(zeroed, proposals, *enc_heads)  # (B, Q, d), (B, Q, 4) logits
        groups = None
        if self.training and self.dn_number and targets is not None:
            assert self.label_enc is not None
            groups = prepare_cdn(targets, self.label_enc, num_queries=self.num_queries, num_classes=self.num_classes,
                                 dn_number=self.dn_number, label_noise_ratio=self.label_noise,
                                 box_noise_scale=self.box_noise, generator=generator)
            content = torch.cat([groups.content.to(content.dtype), content], 1)  # (B, P + Q, d)
            anchors = torch.cat([groups.box_logits.to(anchors.dtype), anchors], 1)  # (B, P + Q, 4)
        allowed = None if groups is None or groups.pad_size == 0 else ~groups.attn_mask  # (T, T) True = may attend
        hs, refs = look_forward_twice(content, anchors.float().sigmoid(), lambda i, t, b: layer(i, t, b, allowed),
                                      num_layers, box_heads, self.norm, look_forward_twice=self.look_twice)
        if self.label_enc is not None:  # every parameter in every step (DDP), as the reference
            hs[0] = hs[0] + self.label_enc.weight[0, 0] * 0.0
        which = range(num_layers) if aux_loss else [num_layers - 1]
        logits = torch.stack([class_heads[i](hs[i]) for i in which])  # (L', B, T, K)
        boxes = layer_boxes([hs[i] for i in which], [refs[i] for i in which], [box_heads[i] for i in which])
        logits, boxes, dn = dn_post_process(logits, boxes, groups.pad_size if groups is not None else 0, aux_loss)
        out = {"pred_logits": logits[-1], "pred_boxes": boxes[-1], "interm_outputs": interm}
        if aux_loss:
            out["aux_outputs"] = [{"pred_logits": a, "pred_boxes": b} for a, b in zip(logits[:-1], boxes[:-1])]
        if dn is not None:
            assert groups is not None
            out["dn_outputs"] = dn
            out["dn_meta"] = {"num_groups": groups.num_groups, "single_pad": groups.single_pad}
        return out

    def extra_repr(self) -> str:
        return (f"dn_number={self.dn_number}, dn_box_noise_scale={self.box_noise}, dn_label_noise_ratio="
                f"{self.label_noise}, look_forward_twice={self.look_twice}, select={self.selection.select!r}")
