"""DINO (Zhang et al., ICLR 2023) as one query strategy of the deformable detector:
``create_detr(attention="deformable", decoder="dino")``.

DINO is DAB's anchors on the deformable operator (``DabQueries``, DINO's formulation: ``p_q =
ref_point_head(A(anchor))`` at every layer, heads shared by the layers, the decoder norm on every
layer's output) plus its three parts (``vispe.models.detr.queries.dn``, each equal to IDEA-Research/DINO's code):

* mixed query selection (``propose``): the anchors are the boxes of the top-k encoder proposals,
  ranked by their best class, detached; the contents are learned (``selection.tgt_embed``). The
  proposals have their own heads (``enc_class``, ``enc_box``: DINO_4scale's
  ``two_stage_*_embed_share=False``), and the selected ones' predictions are ``enc_outputs`` with
  ``"classes": True`` (the set loss with the true classes, DINO's ``interm_outputs``);
* contrastive denoising (``extra_queries``): in training, with targets, ``dn_number`` groups of
  positive and negative noised copies of every target box (``dn_box_noise_scale``,
  ``dn_label_noise_ratio``) run before the matching queries behind DINO's attention mask, and come
  back as ``out["dn_outputs"]`` for ``SetCriterion``'s denoising terms (no matching);
* look-forward-twice (``look_forward_twice``, default True): layer i's boxes add to layer i - 1's
  refined box before its detach (``vispe.models.detr.transformer.decode``).

``decoder_kwargs``: ``anchor_pe`` ("sine": DINO's ``gen_sineembed_for_position``, d_model / 2 features
per coordinate at temperature 10000, scale 2 pi; any additive encoding evaluated at unit coordinates),
``anchor_pe_kwargs``, ``dn_number`` (100; 0: no denoising), ``dn_box_noise_scale`` (1.0, the DINO
repository's training scripts; its config file says 0.4), ``dn_label_noise_ratio`` (0.5),
``look_forward_twice`` (True), ``two_stage_select`` ("valid": an image's queries do not depend on the
padding around it; "all": the reference's). The class head is sigmoid (focal loss), as the paper.
Inverse sigmoids are DINO's (eps 1e-3, ``dn.common``). The anchors are coded in units of each image's
valid area (batch-invariant), where DINO's code scales them by level 0's valid ratio: the same on an
unpadded image.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe.kernels.deformable import Levels
from vispe.models.detr.mlp import MLP
from vispe.models.detr.queries.base import ExtraQueries, StrategyContext, option_bool as _bool
from vispe.models.detr.queries.dn.common import inv_sigmoid
from vispe.models.detr.queries.dn.groups import check_options, prepare_cdn
from vispe.models.detr.queries.dn.selection import MixedQuerySelection
from vispe.models.detr.queries.positioned import DabQueries
from vispe.models.detr.transformer.deformable_decoder import encoder_proposals

PRIOR_PROB = 0.01  # the class heads' focal prior (DINO, Deformable DETR)


class DinoQueries(DabQueries):
    """DINO's queries (module docstring). Parameters: DAB's ``ref_point_head``, ``selection``
    (``enc_output``, ``enc_output_norm``, ``tgt_embed``), ``enc_class``, ``enc_box``, ``label_enc``."""

    design = "dino"
    OPTIONS = frozenset({"anchor_pe", "anchor_pe_kwargs", "dn_number", "dn_box_noise_scale", "dn_label_noise_ratio",
                         "look_forward_twice", "two_stage_select"})
    from_proposals = True
    class_heads = ("sigmoid",)  # the denoising and proposal losses are DINO's focal ones

    def __init__(self, d_model: int, anchor_pe: nn.Module, *, num_queries: int, num_classes: int,
                 dn_number: int = 100, dn_box_noise_scale: float = 1.0, dn_label_noise_ratio: float = 0.5,
                 look_forward_twice: bool = True, two_stage_select: str = "valid") -> None:
        super().__init__(d_model, anchor_pe, query_dim=4, modulate_hw=False, iter_refine=True, keys="sampled",
                         query_scale=False, look_forward_twice=look_forward_twice, formulation="dino",
                         num_queries=num_queries)
        if isinstance(dn_number, bool) or not isinstance(dn_number, int) or dn_number < 0:
            raise ValueError(f"decoder_kwargs['dn_number']={dn_number!r}: expected a non-negative integer (0: no "
                             "denoising; DINO: 100)")
        if dn_number:
            check_options(dn_number, dn_label_noise_ratio, dn_box_noise_scale)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes={num_classes!r}: expected a positive integer")
        self.num_queries, self.num_classes = num_queries, num_classes
        self.dn_number, self.box_noise, self.label_noise = dn_number, dn_box_noise_scale, dn_label_noise_ratio
        self.tgt_embed = None  # the learned contents are the selection's (DINO's transformer.tgt_embed)
        self.selection = MixedQuerySelection(d_model, num_queries, select=two_stage_select)
        self.enc_class, self.enc_box = nn.Linear(d_model, num_classes), MLP(d_model, d_model, 4, 3)
        self.label_enc = nn.Embedding(num_classes + 1, d_model) if dn_number else None
        self.generator: torch.Generator | None = None  # the denoising draws (None: torch's global generator)

    @classmethod
    def build(cls, options: dict, c: StrategyContext) -> DinoQueries:
        kw, anchor_pe = cls._common(options, c)
        if options.get("two_stage_select", "valid") not in ("valid", "all"):
            raise ValueError(f"decoder_kwargs['two_stage_select']={options['two_stage_select']!r}: expected 'valid' "
                             "or 'all'")
        return cls(c.d_model, anchor_pe, num_queries=c.num_queries, num_classes=c.num_classes,
                   dn_number=options.pop("dn_number", 100),
                   dn_box_noise_scale=options.pop("dn_box_noise_scale", 1.0),
                   dn_label_noise_ratio=options.pop("dn_label_noise_ratio", 0.5),
                   look_forward_twice=_bool("look_forward_twice", options.pop("look_forward_twice", True)),
                   two_stage_select=options.pop("two_stage_select", "valid"))

    def reset_proposal_heads(self) -> None:
        """DINO's proposal heads start as its decoder heads: the focal prior bias, a zero last box layer."""
        with torch.no_grad():
            nn.init.constant_(self.enc_class.bias, -math.log((1 - PRIOR_PROB) / PRIOR_PROB))
            nn.init.zeros_(self.enc_box.layers[-1].weight)
            nn.init.zeros_(self.enc_box.layers[-1].bias)

    def propose(self, memory: torch.Tensor, key_padding_mask: torch.Tensor | None, levels: Levels,
                class_head: nn.Module, box_head: nn.Module, k: int, *, class_head_kind: str = "sigmoid"):
        """Mixed query selection: (``embed`` (B, Q, 2d), its last d channels the learned contents; anchors
        (B, Q, 4) unit (cx, cy, w, h), detached; the selected proposals' outputs). The decoder's heads are
        not the proposals' (``enc_class``, ``enc_box``)."""
        zeroed, proposals = encoder_proposals(memory, key_padding_mask, levels)  # (B, N, d), (B, N, 4) +inf: none
        content, anchors, enc = self.selection(zeroed, proposals, self.enc_class, self.enc_box)
        if self.label_enc is not None:  # every parameter in every step (DDP), as DINO's hs[0] += label_enc * 0
            content = content + self.label_enc.weight[0, 0] * 0.0
        embed = torch.cat([torch.zeros_like(content), content], -1)  # (B, Q, 2d): the model reads [..., d:]
        return embed, anchors.float().sigmoid(), {**enc, "classes": True}

    def extra_queries(self, targets: list[dict] | None, B: int, d: int, dtype: torch.dtype,
                      device: torch.device) -> ExtraQueries | None:
        """The denoising groups of ``targets`` (training), or None without targets, boxes or ``dn_number``."""
        if not self.dn_number or targets is None:
            return None
        assert self.label_enc is not None
        if len(targets) != B:
            raise ValueError(f"targets has {len(targets)} entries: expected one per image ({B})")
        g = prepare_cdn(targets, self.label_enc, num_queries=self.num_queries, num_classes=self.num_classes,
                        dn_number=self.dn_number, label_noise_ratio=self.label_noise, box_noise_scale=self.box_noise,
                        generator=self.generator)
        if g.pad_size == 0:
            return None
        meta = {"num_groups": g.num_groups, "single_pad": g.single_pad}
        return ExtraQueries(g.content.to(dtype), g.box_logits.sigmoid(), g.attn_mask, meta)

    def refine(self, i, t, anchors, box_head):
        return (box_head(t) + inv_sigmoid(anchors)).sigmoid()  # (B, T, 4) DINO's eps; detached by the loop

    def boxes(self, raw, anchors):
        ref = torch.stack([inv_sigmoid(a).expand(raw.shape[1], -1, -1) for a in anchors])  # (L, B, T, 4)
        return (raw + ref).sigmoid()

    def extra_repr(self) -> str:
        return (f"dn_number={self.dn_number}, dn_box_noise_scale={self.box_noise}, dn_label_noise_ratio="
                f"{self.label_noise}, look_forward_twice={self.look_forward_twice}, "
                f"two_stage_select={self.selection.select!r}")
