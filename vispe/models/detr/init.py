"""The detector's initialisation: ``create_detr(init="papers" | "legacy")``.

Every scheme starts from what the modules build: the transformer's ``_reset_parameters`` (DETR's:
Xavier-uniform on every matrix of its layers, zero biases in every attention), PyTorch's defaults
elsewhere (backbone projection, query embedding, heads, strategy MLPs), each encoding's own.

``"legacy"`` stops there: vispe's initialisation before issue 35, for every design.

``"papers"`` (default) changes the positioned designs (Conditional DETR, DAB-DETR) to what their
code does (Atten4Vis/ConditionalDETR ``models/conditional_detr.py`` and ``transformer.py``,
IDEA-Research/DAB-DETR ``models/DAB_DETR/DABDETR.py`` and ``transformer.py``):

* the class head's bias at the focal-loss prior ``-log((1 - 0.01) / 0.01)`` (sigmoid head only: the
  prior is the focal loss's; a softmax head keeps PyTorch's default);
* the box head's last layer zeroed (weight and bias), so a query's first box is its anchor (DAB's
  refinement then starts from the anchors instead of moving them all from step 0);
* Xavier-uniform on the strategy's MLPs (``query_scale``, ``ref_point_head``, ``ref_anchor_head``),
  which the papers keep inside their transformer and so under its ``_reset_parameters``; their
  biases keep PyTorch's default, as there;
* the decoder attentions' content projections (``qkv``: the papers' ``sa_qcontent_proj``,
  ``ca_kcontent_proj``, ``ca_v_proj``, ...) keep ``nn.Linear``'s default biases, uniform in
  +-1/sqrt(d_model), where DETR's ``nn.MultiheadAttention`` (and vispe's legacy scheme) zero them;
  the output projections' biases stay zero (the papers' own attention zeroes ``out_proj.bias``).

Encodings keep their own initialisation (RoPE-Mixed's ``freqs``, learned tables, an anchor code's
parameters), as do Plain-DETR's box bias (Xavier, as every matrix of the decoder) and Relation-DETR's
relation (PyTorch's default, as its reference). DETR's design has one initialisation, DETR's own,
which both names give. transformers' ports differ from the papers: ``ConditionalDetrForObjectDetection``
draws every Linear from N(0, 0.02) with zero biases and sets no prior; ``DabDetrForObjectDetection``
zeroes the box head's last layer and sets the prior from ``1 / (num_labels + 1)``.

The papers' initialisation (``deformable_init``): the transformer's matrices Xavier-uniform (each
encoder / decoder layer resets itself, ``MSDeformAttn`` its own), the level embedding N(0, 1), the
class heads' bias at the focal prior ``-log((1 - 0.01) / 0.01)`` (sigmoid heads), every box head's last
layer zero, and for Deformable DETR's single-stage queries the first box head's size bias -2 (boxes
start small around the reference points); ``reference_points`` Xavier-uniform with zero bias, the
strategy's other matrices (DAB's ``ref_point_head``, the two-stage ``enc_output`` / ``pos_trans``)
Xavier-uniform with PyTorch's default biases, the input projections Xavier-uniform with zero biases.
With one head per layer, the heads start as copies of one (the papers' ``_get_clones``).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from vispe.attention import Attention
from vispe.encoding import PositionEncoding

PRIOR_PROB = 0.01


def xavier_matrices(module: nn.Module) -> None:
    """Xavier-uniform on every matrix of ``module`` (``p.dim() > 1``, in ``parameters()`` order) except those of
    the encodings inside it, which keep their own initialisation: the papers' ``_reset_parameters`` as every
    scheme here uses it (DETR's transformer, the positioned designs' and Deformable DETR's strategies)."""
    own = {id(p) for m in module.modules() if isinstance(m, PositionEncoding) for p in m.parameters()}
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1 and id(p) not in own:
                nn.init.xavier_uniform_(p)


def papers_init(model: nn.Module) -> None:
    """Apply the papers' initialisation (module docstring) to a built positioned-design ``DETR``."""
    if model.queries.design == "detr":
        return
    with torch.no_grad():
        if model.class_head == "sigmoid":
            nn.init.constant_(model.class_embed.bias, -math.log((1 - PRIOR_PROB) / PRIOR_PROB))
        nn.init.zeros_(model.bbox_embed.layers[-1].weight)
        nn.init.zeros_(model.bbox_embed.layers[-1].bias)
        xavier_matrices(model.queries)
        for layer in model.transformer.decoder:
            for attn in (layer.self_attn, layer.cross_attn):
                if isinstance(attn, Attention) and attn.qkv.bias is not None:
                    bound = 1 / math.sqrt(attn.qkv.in_features)  # nn.Linear's default bias, per q, k, v row
                    nn.init.uniform_(attn.qkv.bias, -bound, bound)


def _unique(modules) -> list[nn.Module]:
    seen, out = set(), []
    for m in modules:
        if id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out


def deformable_init(model: nn.Module) -> None:
    """Deformable DETR's initialisation of the heads and the query strategy (module docstring); the layers,
    input projections and level embedding initialise themselves when built."""
    q = model.queries
    with torch.no_grad():
        if model.class_head == "sigmoid":
            for head in _unique(model.class_embed):
                nn.init.constant_(head.bias, -math.log((1 - PRIOR_PROB) / PRIOR_PROB))
        for box in _unique(model.bbox_embed):
            nn.init.zeros_(box.layers[-1].weight)
            nn.init.zeros_(box.layers[-1].bias)
        if q.design == "deformable" and not q.two_stage:
            nn.init.constant_(model.bbox_embed[0].layers[-1].bias[2:], -2.0)
        xavier_matrices(q)
        if hasattr(q, "reset_proposal_heads"):  # a strategy's own proposal heads (DINO's) start as the heads do
            q.reset_proposal_heads()
        if getattr(q, "reference_points", None) is not None:
            nn.init.zeros_(q.reference_points.bias)
