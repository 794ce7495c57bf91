"""DINO's mixed query selection (Zhang et al., ICLR 2023, section 3.4; IDEA-Research/DINO
``DeformableTransformer.forward``, ``two_stage_type="standard"``, ``embed_init_tgt=True``).

Every encoder token proposes a box (Deformable DETR's two-stage proposals: the caller's, e.g.
``vispe.models.detr.transformer.deformable_decoder.encoder_proposals``, logits (cx, cy, w, h), +inf where a token
has none). Here::

    m       = LayerNorm(Linear(memory))                        enc_output, enc_output_norm   (B, N, d)
    scores  = class_head(m).max(-1)                             the best class of each token  (B, N)
    coords  = box_head(m) + proposals                           box logits                    (B, N, 4)
    top     = topk(scores, num_queries)
    anchors = coords[top].detach()                              the positional queries' boxes (logits)
    content = tgt_embed.weight                                  learned, the same for every image

(the "mixed" of the paper: positions from the encoder, contents learned, not the selected features
as in two-stage Deformable DETR). The selected tokens' predictions (``class_head(m[top])`` and
``sigmoid(coords[top])``, undetached) are DINO's ``interm_outputs``: they get the set loss with the
true classes.

``select``: "valid" (default) scores only tokens that have a proposal, so an image's queries do not
depend on the padding around it; "all" is the reference's: a padded token (zeroed memory, one constant
score) competes too, and its box is +inf logits.
"""
from __future__ import annotations

import torch
from torch import nn

SELECTS = ("valid", "all")


class MixedQuerySelection(nn.Module):
    """Reference boxes from the top-k encoder proposals, content queries learned (module docstring).
    Parameters as the reference: ``enc_output``, ``enc_output_norm``, ``tgt_embed``."""

    def __init__(self, d_model: int, num_queries: int, *, select: str = "valid") -> None:
        super().__init__()
        if select not in SELECTS:
            raise ValueError(f"select={select!r}: expected one of {', '.join(map(repr, SELECTS))}")
        if isinstance(num_queries, bool) or not isinstance(num_queries, int) or num_queries < 1:
            raise ValueError(f"num_queries={num_queries!r}: expected a positive integer")
        self.select, self.num_queries = select, num_queries
        self.enc_output, self.enc_output_norm = nn.Linear(d_model, d_model), nn.LayerNorm(d_model)
        self.tgt_embed = nn.Embedding(num_queries, d_model)

    def forward(self, memory: torch.Tensor, proposals: torch.Tensor, class_head: nn.Module,
                box_head: nn.Module) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """``memory`` (B, N, d) (padded and border tokens zeroed), ``proposals`` (B, N, 4) logits (+inf:
        none) -> (content (B, Q, d), anchors (B, Q, 4) logits, detached, the selected tokens' outputs
        {"pred_logits" (B, Q, K), "pred_boxes" (B, Q, 4)})."""
        B, N, d = memory.shape
        if proposals.shape != (B, N, 4):
            raise ValueError(f"proposals {tuple(proposals.shape)}: expected {(B, N, 4)} box logits per token")
        k = self.num_queries
        if k > N:
            raise ValueError(f"num_queries={k}: the encoder has only {N} tokens to select from")
        m = self.enc_output_norm(self.enc_output(memory))  # (B, N, d)
        scores = class_head(m)  # (B, N, K)
        coords = box_head(m) + proposals  # (B, N, 4) logits
        best = scores.max(-1).values  # (B, N)
        if self.select == "valid":
            none = proposals[..., 0].isinf()  # (B, N) tokens without a proposal
            counts = (~none).sum(1)  # (B,)
            short = int(counts.argmin())
            if k > int(counts[short]):
                raise ValueError(f"num_queries={k}: image {short} has only {int(counts[short])} proposals (tokens whose "
                                 "box lies inside its valid area), alone or padded alike; expected num_queries <= "
                                 f"{int(counts[short])}, larger images, or select='all' (the reference's: padded "
                                 "tokens compete too)")
            best = best.masked_fill(none, float("-inf"))
        top = best.topk(k, dim=1).indices  # (B, Q)
        chosen = coords.gather(1, top[..., None].expand(-1, -1, 4))  # (B, Q, 4) logits, undetached
        picked = m.gather(1, top[..., None].expand(-1, -1, d))  # (B, Q, d)
        content = self.tgt_embed.weight[None].expand(B, -1, -1)  # (B, Q, d)
        enc = {"pred_logits": class_head(picked), "pred_boxes": chosen.sigmoid()}
        return content, chosen.detach(), enc
