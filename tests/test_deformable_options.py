"""Issue 46's six defects of the deformable detector, each reproduced as a new user would try it: options that
silently cannot train are refused at build with the reason, two-stage selection agrees alone and padded,
the paper's defaults, and DAB on deformable attention as DINO has it."""
import math

import pytest
import torch

from vispe.models.detr import create_detr
from vispe.models.detr.mlp import MLP
from vispe.models.detr.queries.deformable import DeformableQueries

TINY = dict(backbone="small_cnn", backbone_widths=(4, 8, 8), d_model=32, nheads=2, enc_layers=1, dec_layers=2,
            dim_feedforward=32, num_queries=3, dropout=0.0, attention="deformable", num_feature_levels=2,
            backbone_levels=1, n_points=2)


def _loss(out):
    parts = [out, *out.get("aux_outputs", [])] + ([out["enc_outputs"]] if "enc_outputs" in out else [])
    return sum(o["pred_logits"].sum() + o["pred_boxes"].sum() for o in parts)


# --- 1. aux_loss=False with per-layer heads under refinement -------------------------------------------------
def test_refinement_with_per_layer_heads_and_no_auxiliary_loss_is_refused():
    """Deformable DETR's refinement clones the heads per layer and detaches the refined anchors: without the
    auxiliary losses every head but the last gets no gradient (DDP stops), so it is refused with the reason."""
    with pytest.raises(ValueError, match=r"aux_loss=False with decoder_kwargs\['with_box_refine'\]=True: .*no gradient"):
        create_detr(3, **TINY, decoder="deformable", decoder_kwargs=dict(with_box_refine=True), aux_loss=False)


@pytest.mark.parametrize("kw", [dict(decoder="dab"), dict(decoder="deformable"),
                                dict(decoder="deformable", decoder_kwargs=dict(two_stage=True))])
def test_without_auxiliary_loss_the_accepted_designs_train_every_parameter(kw):
    """DAB on deformable attention shares its heads under refinement (DINO's), so the last layer's loss
    reaches them: accepted, and every parameter gets a gradient from the final outputs alone."""
    torch.manual_seed(0)
    model = create_detr(3, **TINY, **kw, aux_loss=False).train()
    out = model(torch.randn(2, 3, 32, 48))
    assert "aux_outputs" not in out
    _loss(out).backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing


# --- 2. two-stage "valid" selection: alone and padded agree ---------------------------------------------------
def _proposal_counts(model, images, mask):
    """The queries' anchors of a two-stage model (the selected proposals)."""
    seen = {}
    q = model.queries
    real = q.propose

    def spy(*a, **k):
        embed, anchors, enc = real(*a, **k)
        seen["anchors"] = anchors
        return embed, anchors, enc

    q.propose = spy
    try:
        model(images, mask)
    finally:
        del q.propose
    return seen["anchors"]


def test_two_stage_valid_selection_refuses_alike_alone_and_padded():
    """A 32x32 image has 20 proposals (4x4 at stride 8, 2x2 at 16): 30 queries cannot all be proposals. Alone
    it was refused ("only 20 tokens") while padded into a 64x64 batch 10 queries sat at the padding's anchor
    (1, 1, 1, 1); now both are refused with the same message."""
    torch.manual_seed(0)
    model = create_detr(3, **{**TINY, "num_queries": 30}, decoder="deformable",
                        decoder_kwargs=dict(two_stage=True)).eval()
    small = torch.randn(1, 3, 32, 32)
    images = torch.zeros(2, 3, 64, 64)
    images[0, :, :32, :32] = small[0]
    images[1] = torch.randn(3, 64, 64)
    mask = torch.ones(2, 64, 64, dtype=torch.bool)
    mask[0, :32, :32], mask[1] = False, False
    for args in ((small,), (images, mask)):
        with pytest.raises(ValueError, match=r"num_queries=30: image 0 has only 20 proposals"):
            model(*args)


def test_two_stage_valid_selection_picks_only_proposals_when_there_are_enough():
    torch.manual_seed(0)
    model = create_detr(3, **{**TINY, "num_queries": 5}, decoder="deformable",
                        decoder_kwargs=dict(two_stage=True)).eval()
    small = torch.randn(1, 3, 32, 32)
    images = torch.zeros(2, 3, 64, 64)
    images[0, :, :32, :32] = small[0]
    mask = torch.ones(2, 64, 64, dtype=torch.bool)
    mask[0, :32, :32], mask[1] = False, False
    with torch.no_grad():
        alone, padded = _proposal_counts(model, small, None), _proposal_counts(model, images, mask)
    assert torch.isfinite(padded).all() and (padded[0] < 1).all()
    torch.testing.assert_close(padded[:1].sort(1).values, alone.sort(1).values, atol=1e-5, rtol=0)


# --- 3. pe="none" with pe_at encoder "none": nothing enters the encoder -------------------------------------------
def test_encoder_none_leaves_no_level_embedding_in_the_encoder():
    none_at = {"encoder": "none", "decoder": "attn"}
    torch.manual_seed(0)
    model = create_detr(3, **TINY, decoder="deformable", pe="none", pe_at=none_at).eval()
    assert model.level_pos.level_embed is None  # built for no one
    calls = []
    model.encoder.register_forward_pre_hook(lambda m, args: calls.append(args[2]))
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 48))
    assert calls == [None]
    with pytest.raises(ValueError, match=r"level_pe='learned' with pe_at encoder='none'.*used nowhere"):
        create_detr(3, **TINY, decoder="deformable", pe="none", pe_at=none_at, level_pe="learned")


# --- 4. two-stage with a softmax class head ranks by the proposals' object probability ----------------------------
def test_two_stage_with_a_softmax_head_ranks_proposals_by_the_probability_of_label_0():
    """The encoder loss trains the proposals class-agnostically (every label 0): with a softmax head a
    proposal's score is the probability of label 0 (no-object logit included), not its raw logit."""
    q = DeformableQueries(8, two_stage=True)

    class Head(torch.nn.Module):
        def forward(self, mem):  # proposal 0: logit 5 but no-object 9; proposal 1: logit 1, no-object -5
            out = torch.full((*mem.shape[:2], 3), -5.0)
            out[:, 0, 0], out[:, 0, 2] = 5.0, 9.0
            out[:, 1, 0] = 1.0
            return out

    from vispe.kernels.deformable import Levels
    levels = Levels(((2, 2),))
    memory = torch.randn(1, 4, 8)
    box = MLP(8, 8, 4, 2)
    _, sig_anchors, _ = q.propose(memory, None, levels, Head(), box, 1, class_head_kind="sigmoid")
    _, soft_anchors, _ = q.propose(memory, None, levels, Head(), box, 1, class_head_kind="softmax")
    centres = torch.tensor([[0.25, 0.25], [0.75, 0.25], [0.25, 0.75], [0.75, 0.75]])  # (cx, cy) of tokens 0..3
    dist = lambda a: (centres - a[0, 0, :2]).abs().sum(-1)  # noqa: E731
    assert dist(sig_anchors).argmin() == 0 and dist(soft_anchors).argmin() == 1


# --- 5. the paper's defaults --------------------------------------------------------------------------------
def test_the_deformable_detector_defaults_to_the_papers_sizes():
    """FFN 1024, 300 queries and the sine at cell centres (offset -0.5), as Deformable DETR and transformers'
    DeformableDetrConfig; DETR's stay DETR's (2048, 100, offset 0)."""
    small = dict(backbone="small_cnn", backbone_widths=(4, 8, 8), d_model=32, nheads=2, enc_layers=1, dec_layers=1)
    model = create_detr(3, **small, attention="deformable", num_feature_levels=2, backbone_levels=1)
    assert model.query_embed.num_embeddings == 300
    assert model.decoder.layers[0].mlp.fc1.out_features == 1024
    assert model.encoder.layers[0].mlp.fc1.out_features == 1024
    assert model.level_pos.pe.offset == -0.5
    from transformers import DeformableDetrConfig
    c = DeformableDetrConfig()
    assert (c.num_queries, c.encoder_ffn_dim, c.decoder_ffn_dim) == (300, 1024, 1024)
    dense = create_detr(3, **{**small, "backbone_widths": (4, 8)})
    assert dense.query_embed.num_embeddings == 100 and dense.transformer.decoder[0].mlp.fc1.out_features == 2048
    assert dense.pe.offset == 0.0
    assert create_detr(3, **small, attention="deformable", num_feature_levels=2, backbone_levels=1,
                       pe_kwargs=dict(offset=0.0)).level_pos.pe.offset == 0.0  # an explicit setting wins


# --- 6. DAB on deformable attention is DINO's query formulation -------------------------------------------------
def test_dab_on_deformable_attention_is_dinos_formulation():
    """Learned content queries (``tgt_embed``), heads shared by the layers under refinement, the decoder norm on
    every layer's output (as the dense path); DINO's (IDEA-Research/DINO ``deformable_transformer.py``:
    ``tgt_embed``, ``dec_pred_bbox_embed_share=True``, ``intermediate.append(self.norm(output))``)."""
    torch.manual_seed(0)
    model = create_detr(3, **TINY, decoder="dab")
    assert model.queries.tgt_embed.weight.shape == (3, 32)
    assert all(h is model.bbox_embed[0] for h in model.bbox_embed)
    assert all(h is model.class_embed[0] for h in model.class_embed)
    assert isinstance(model.decoder.norm, torch.nn.LayerNorm)
    seen = []
    model.decoder.norm.register_forward_hook(lambda m, a, o: seen.append(o))
    with torch.no_grad():
        out = model.eval()(torch.randn(1, 3, 32, 48))
    assert len(seen) == 2  # each layer's output, normed
    # the final logits are the class head of the normed last output
    torch.testing.assert_close(out["pred_logits"], model.class_embed[0](seen[-1]))
    content = []
    model.decoder.layers[0].register_forward_pre_hook(lambda m, a: content.append(a[0]))
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 48))
    torch.testing.assert_close(content[0][0], model.queries.tgt_embed.weight)  # the learned content, not zeros


def test_deformable_detrs_own_design_keeps_per_layer_heads_and_no_decoder_norm():
    """Deformable DETR (the paper, transformers): one head per layer under refinement, no decoder norm."""
    model = create_detr(3, **TINY, decoder="deformable", decoder_kwargs=dict(with_box_refine=True))
    assert model.bbox_embed[0] is not model.bbox_embed[1]
    assert model.decoder.norm is None
    assert math.isclose(model.bbox_embed[0].layers[-1].bias[2].item(), -2.0)
