"""Deformable DETR's own query formulation (Zhu et al., ICLR 2021): ``create_detr(decoder="deformable",
attention="deformable")``.

Single-stage: the learned ``query_embed`` (Q, 2d) is split into the query position ``p_q`` (first d
channels) and the decoder's initial content (last d); each query's reference point is
``sigmoid(reference_points(p_q))``, a point (cx, cy) in unit coordinates of the image's valid area,
which the deformable cross-attention of every layer samples around (``p_q`` added to its query).

``with_box_refine`` (the paper's iterative bounding-box refinement): after layer i, layer i's box head
moves the reference, ``sigmoid(bbox_embed[i](t) + inverse_sigmoid(ref)).detach()`` (a point's first two
coordinates only, after which it is a box (cx, cy, w, h), sampled with the box rule); the detector then
has one class and one box head per layer (else one of each, shared).

``two_stage`` (the paper's A.4): every encoder token proposes a box (``encoder_proposals``), scored by
the class head and regressed by the box head after ``enc_output``/``enc_output_norm``; the top Q by the
first class's score become the anchors (boxes, detached) and ``pos_trans_norm(pos_trans(sine))`` of
them the queries' (``p_q``, content) (``proposal_sine``, d / 2 features per coordinate as transformers:
the paper's 128 at d = 256). ``two_stage_select``: "valid" (default) scores only tokens that have a
proposal, so the queries of an image do not depend on the padding around it; "all" is the papers'
(transformers', fundamentalvision's): every token competes, and the padded tokens' one constant score
can take queries (their boxes are +inf logits). ``load_detr`` sets "all" for equality with them.

Boxes (``boxes``): the box head's output plus the inverse sigmoid of the anchors each layer used (a
point adds to (cx, cy) only), then the sigmoid, as the references.
"""
from __future__ import annotations

import torch
from torch import nn

from vispe import _checks
from vispe.attention import PosContext
from vispe.kernels.deformable import Levels
from vispe.models.detr.mlp import inverse_sigmoid
from vispe.models.detr.queries.base import LayerPositions, QueryPositions, StrategyContext
from vispe.models.detr.transformer.deformable_decoder import encoder_proposals, proposal_sine

SELECTS = ("valid", "all")


class DeformableQueries(QueryPositions):
    """Deformable DETR's queries (module docstring). Parameters: ``reference_points`` (single-stage), or
    ``enc_output``, ``enc_output_norm``, ``pos_trans``, ``pos_trans_norm`` (two-stage): transformers' names."""

    design = "deformable"
    OPTIONS = frozenset({"with_box_refine", "two_stage", "two_stage_select"})
    class_head = "sigmoid"

    def __init__(self, d_model: int, *, with_box_refine: bool = False, two_stage: bool = False,
                 two_stage_select: str = "valid") -> None:
        super().__init__(d_model)
        for name, value in (("with_box_refine", with_box_refine), ("two_stage", two_stage)):
            if not isinstance(value, bool):
                raise ValueError(f"decoder_kwargs[{name!r}]={value!r}: expected True or False")
        if two_stage_select != "valid" and not two_stage:
            raise ValueError(f"decoder_kwargs['two_stage_select']={two_stage_select!r} with two_stage=False: there are "
                             "no proposals to select; expected it unset")
        self.select = _checks.choice("decoder_kwargs['two_stage_select']", two_stage_select, SELECTS)
        self.with_box_refine = self.refines = with_box_refine
        self.shared_heads = not with_box_refine  # the paper's clones under refinement
        self.decoder_norm = False  # Deformable DETR's decoder ends without a norm (the paper, transformers)
        self.two_stage = self.from_proposals = self.anchor_boxes = two_stage
        self.query_dim = None if two_stage else 2 * d_model  # query_embed: (p_q, content); none when two-stage
        d = d_model
        if two_stage:
            self.enc_output, self.enc_output_norm = nn.Linear(d, d), nn.LayerNorm(d)
            self.pos_trans, self.pos_trans_norm = nn.Linear(2 * d, 2 * d), nn.LayerNorm(2 * d)
        else:
            self.reference_points = nn.Linear(d, 2)  # p_q -> (cx, cy) before the sigmoid

    @classmethod
    def build(cls, options: dict, c: StrategyContext) -> DeformableQueries:
        return cls(c.d_model, with_box_refine=options.pop("with_box_refine", False),
                   two_stage=options.pop("two_stage", False), two_stage_select=options.pop("two_stage_select", "valid"))

    def query_pos_in_cross(self, i: int) -> bool:
        return True

    def start(self, embed: torch.Tensor, B: int, dtype: torch.dtype):
        """Content (B, Q, d) and reference points (1, Q, 2) from ``query_embed`` (Q, 2d)."""
        pos, content = embed.split(self.d_model, -1)  # (Q, d) each
        return content[None].to(dtype).expand(B, -1, -1), self.reference_points(pos[None]).float().sigmoid()

    def propose(self, memory: torch.Tensor, key_padding_mask: torch.Tensor | None, levels: Levels,
                class_head: nn.Module, box_head: nn.Module, k: int, *, class_head_kind: str = "sigmoid"):
        """Two-stage queries: (``embed`` (B, Q, 2d) as (p_q, content), anchors (B, Q, 4) unit (cx, cy, w, h),
        the proposals' outputs {"pred_logits" (B, N, K), "pred_boxes" (B, N, 4)} for the encoder loss).

        A proposal's score is what the encoder loss trains (class-agnostic: every target label 0): label 0's
        logit for a sigmoid head, label 0's log-probability for a softmax head (its no-object logit counts).
        With ``two_stage_select="valid"`` an image with fewer proposals than ``k`` is refused, alone or
        padded in a batch alike (padding has no proposal to give)."""
        mem, logits = encoder_proposals(memory, key_padding_mask, levels)  # (B, N, d), (B, N, 4) +inf: none
        mem = self.enc_output_norm(self.enc_output(mem))  # (B, N, d)
        scores = class_head(mem)  # (B, N, K)
        coords = box_head(mem) + logits  # (B, N, 4) logits
        first = scores[..., 0] if class_head_kind == "sigmoid" else scores.log_softmax(-1)[..., 0]  # (B, N)
        if self.select == "valid":
            none = logits[..., 0].isinf()  # (B, N) tokens without a proposal
            counts = (~none).sum(1)  # (B,)
            short = int(counts.argmin())
            if k > int(counts[short]):
                raise ValueError(f"num_queries={k}: image {short} has only {int(counts[short])} proposals (tokens whose "
                                 "box lies inside its valid area), alone or padded alike; expected num_queries <= "
                                 f"{int(counts[short])}, larger images, or two_stage_select='all' (the papers': padded "
                                 "tokens compete too)")
            first = first.masked_fill(none, float("-inf"))
        if k > first.shape[1]:
            raise ValueError(f"num_queries={k}: the encoder has only {first.shape[1]} tokens to propose from")
        top = first.topk(k, dim=1).indices  # (B, Q)
        chosen = coords.gather(1, top[..., None].expand(-1, -1, 4)).detach()  # (B, Q, 4) logits
        embed = self.pos_trans_norm(self.pos_trans(proposal_sine(chosen, self.d_model // 2)))  # (B, Q, 2d)
        return embed, chosen.float().sigmoid(), {"pred_logits": scores, "pred_boxes": coords.sigmoid()}

    def layer(self, i: int, t: torch.Tensor, embed: torch.Tensor, anchors, memory_ctx) -> LayerPositions:
        pos = embed[..., :self.d_model]  # (Q, d) or (B, Q, d)
        ctx = PosContext(pos=(pos if pos.dim() == 3 else pos[None]).to(t.dtype))
        return LayerPositions(ctx, ctx, memory_ctx, anchors)

    def refine(self, i: int, t: torch.Tensor, anchors, box_head: nn.Module):
        if not self.with_box_refine:
            return anchors
        delta = box_head(t)  # (B, Q, 4)
        ref = inverse_sigmoid(anchors)  # (B|1, Q, 2|4)
        new = delta + ref if ref.shape[-1] == 4 else torch.cat([delta[..., :2] + ref, delta[..., 2:]], -1)
        return new.sigmoid()  # (B, Q, 4): a box from here on (detached by the decode loop)

    def boxes(self, raw: torch.Tensor, anchors: list) -> torch.Tensor:
        out = []
        for r, a in zip(raw, anchors):  # per layer: the anchors may be points, then boxes
            ref = inverse_sigmoid(a)
            out.append((r + ref if ref.shape[-1] == 4 else torch.cat([r[..., :2] + ref, r[..., 2:]], -1)).sigmoid())
        return torch.stack(out)  # (L, B, Q, 4)

    def extra_repr(self) -> str:
        return f"with_box_refine={self.with_box_refine}, two_stage={self.two_stage}, two_stage_select={self.select!r}"
