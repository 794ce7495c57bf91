"""Conditional DETR and DAB-DETR against transformers' classes, built from small configs with random
weights (nothing downloaded), loaded with ``load_detr``: final and auxiliary outputs on a padded,
non-square batch; bare state_dicts; refusals."""
import pytest
import torch
from test_detr_reference import batch  # two non-square images, the second padded bottom/right
from transformers import (
    ConditionalDetrConfig,
    ConditionalDetrForObjectDetection,
    DabDetrConfig,
    DabDetrForObjectDetection,
    DetrConfig,
    DetrForObjectDetection,
)

from vispe.models.detr import load_detr
from vispe.models.detr.mlp import inverse_sigmoid

SMALL = dict(use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False, encoder_layers=2,
             decoder_layers=2, num_queries=10, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=128, decoder_ffn_dim=128, num_labels=5)


def randomise(model, seed=0):
    """Every weight and BN statistic random and O(1), so nothing is trivially zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.is_floating_point():
                continue
            if "running_var" in name:
                t.copy_(torch.rand(t.shape, generator=g) * 1.5 + 0.5)
            elif t.dim() > 1:
                std = 1.0 if "embeddings" in name else 1.0 / t[0].numel() ** 0.5
                t.copy_(torch.randn(t.shape, generator=g) * std)
            elif name.endswith("weight"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
    return model.eval()


def hf_conditional(**kw):
    return randomise(ConditionalDetrForObjectDetection(ConditionalDetrConfig(**{**SMALL, "d_model": 64, **kw})))


def hf_dab(**kw):
    model = DabDetrForObjectDetection(DabDetrConfig(**{**SMALL, "hidden_size": 64, **kw}))
    return randomise(model)  # the decoder's box head is tied to bbox_predictor: randomised once


def conditional_reference(hf, images, mask):
    """transformers' final outputs and, from hooks on its decoder layers, every layer's outputs
    (its auxiliary_loss=True feeds normalised states forward, which the paper's code does not)."""
    states = []
    hooks = [layer.register_forward_hook(lambda m, i, o: states.append(o[0] if isinstance(o, tuple) else o))
             for layer in hf.model.decoder.layers]
    with torch.no_grad():
        out = hf(pixel_values=images, pixel_mask=(~mask).long())
        hs = hf.model.decoder.layernorm(torch.stack(states))  # (L, B, Q, d)
        raw = hf.bbox_predictor(hs)
        refp = hf.model.decoder.ref_point_head(hf.model.query_position_embeddings.weight).sigmoid()  # (Q, 2)
        raw[..., :2] += inverse_sigmoid(refp)
        layers = (hf.class_labels_classifier(hs), raw.sigmoid())
    for h in hooks:
        h.remove()
    return out.logits, out.pred_boxes, layers


def dab_reference(hf, images, mask):
    with torch.no_grad():
        out = hf(pixel_values=images, pixel_mask=(~mask).long())
        mo = hf.model(pixel_values=images, pixel_mask=(~mask).long())
        hs, refs = mo.intermediate_hidden_states, mo.reference_points  # (L, B, Q, d), (L, B, Q, 4)
        raw = hf.bbox_predictor(hs)
        raw[..., :4] += inverse_sigmoid(refs)
        layers = (hf.class_embed(hs), raw.sigmoid())
    return out.logits, out.pred_boxes, layers


def assert_outputs_equal(model, reference, atol=1e-4):
    images, mask = batch()
    logits, boxes, (layer_logits, layer_boxes) = reference
    with torch.no_grad():
        out = model(images, mask)
    torch.testing.assert_close(out["pred_logits"], logits, rtol=0, atol=atol)
    torch.testing.assert_close(out["pred_boxes"], boxes, rtol=0, atol=atol)
    assert len(out["aux_outputs"]) == layer_logits.shape[0] - 1
    for i, aux in enumerate(out["aux_outputs"]):
        torch.testing.assert_close(aux["pred_logits"], layer_logits[i], rtol=0, atol=atol)
        torch.testing.assert_close(aux["pred_boxes"], layer_boxes[i], rtol=0, atol=atol)
    torch.testing.assert_close(layer_logits[-1], logits, rtol=0, atol=1e-5)  # the hooks read the same model
    return out


def test_conditional_detr_equals_transformers_with_auxiliary_outputs():
    hf = hf_conditional()
    model = load_detr(hf).eval()
    assert model.queries.design == "conditional" and model.class_head == "sigmoid"
    out = assert_outputs_equal(model, conditional_reference(hf, *batch()))
    assert out["pred_logits"].shape == (2, 10, 5)  # K sigmoid logits, no "no object"


def test_dab_detr_equals_transformers_with_auxiliary_outputs():
    hf = hf_dab()
    model = load_detr(hf).eval()
    assert model.queries.design == "dab" and model.pe.temperature == 20 and model.queries.modulate_hw
    assert_outputs_equal(model, dab_reference(hf, *batch()))
    # the anchors are refined: layer 1 used other boxes than layer 0, so the outputs test refinement
    with torch.no_grad():
        refs = hf.model(*batch()[:1], pixel_mask=(~batch()[1]).long()).reference_points
    assert (refs[1] - refs[0]).abs().max() > 1e-3


@pytest.mark.parametrize("make, reference", [(hf_conditional, conditional_reference), (hf_dab, dab_reference)])
def test_one_decoder_layer_loads_without_its_idle_query_scale(make, reference):
    """With one decoder layer the references build query_scale (used from the second layer on) and
    never run it; vispe builds no idle module (issue 35), so loading refused the weights until they
    were left out for exactly that case. The outputs equal the reference's."""
    hf = make(decoder_layers=1)
    model = load_detr(hf).eval()
    assert model.queries.query_scale is None
    assert_outputs_equal(model, reference(hf, *batch()))


def test_dab_detr_keep_query_pos_and_random_refpoints_load():
    hf = hf_dab(keep_query_pos=True, random_refpoints_xy=True, decoder_layers=3)
    model = load_detr(hf).eval()
    assert model.queries.keep_query_pos and model.transformer.decoder[2].cross_attn.q_pos is not None
    assert_outputs_equal(model, dab_reference(hf, *batch()))


@pytest.mark.parametrize("make", [hf_conditional, hf_dab], ids=["conditional", "dab"])
def test_a_bare_state_dict_needs_the_head_count(make):
    hf = make()
    state = dict(hf.state_dict())
    with pytest.raises(ValueError, match="number of attention heads cannot be read.*pass nheads"):
        load_detr(state)
    extra = dict(pe_kwargs=dict(temperature=20.0)) if make is hf_dab else {}
    model = load_detr(state, nheads=4, **extra).eval()
    ref = conditional_reference(hf, *batch()) if make is hf_conditional else dab_reference(hf, *batch())
    assert_outputs_equal(model, ref)


def test_detr_bare_state_dict_is_refused_without_heads_instead_of_guessing_eight():
    hf = randomise(DetrForObjectDetection(DetrConfig(**{**SMALL, "d_model": 64})))
    with pytest.raises(ValueError, match="pass nheads"):
        load_detr(hf.state_dict())
    # with the count the 4-head model loads exactly (8 would be off: that is what guessing did)
    images, mask = batch()
    with torch.no_grad():
        ref = hf(pixel_values=images, pixel_mask=(~mask).long()).logits
        ok = load_detr(hf.state_dict(), nheads=4).eval()(images, mask)["pred_logits"]
        wrong = load_detr(hf.state_dict(), nheads=8).eval()(images, mask)["pred_logits"]
    torch.testing.assert_close(ok, ref, rtol=0, atol=1e-4)
    assert (wrong - ref).abs().max() > 1e-3


def test_dab_refuses_what_vispe_does_not_build():
    with pytest.raises(ValueError, match="num_patterns=2"):
        load_detr(hf_dab(num_patterns=2))
    state = dict(hf_dab().state_dict())
    key = next(k for k in state if k.startswith("model.decoder.bbox_embed.layers.0.weight"))
    state[key] = state[key] + 1
    with pytest.raises(ValueError, match="box head .* and its box predictor differ"):
        load_detr(state, nheads=4)
