"""vispe's DEIMv2 (``DEIMv2``: D-FINE with DEIMv2's fusion blocks and decoder layers; transformers' HGNetV2
wrapped, or vispe's DINOv3 with the spatial tuning adapter) against transformers' Deimv2ForObjectDetection
from small configs with random weights, every parameter perturbed, num_queries=30, a non-square batch:
eval logits and boxes (and the encoder's proposals), training with denoising seeded alike (every layer, the
pre-box head's, the denoising queries), other sizes, and the encodings swapped by name after loading."""
import pytest
import torch
from test_deformable_encoder import perturb
from test_rtdetr import ATOL, check_eval, diff, images, train_both
from transformers import Deimv2Config, Deimv2ForObjectDetection

from vispe.models.detr import load_detr
from vispe.models.detr.realtime.deimv2 import DEIMv2
from vispe.models.detr.realtime.deimv2_backbone import DINOv3Backbone
from vispe.models.detr.realtime.deimv2_lite import LiteEncoder

HGNET = dict(model_type="hgnet_v2", stem_channels=[3, 16, 16], stage_in_channels=[16, 32, 64, 128],
             stage_mid_channels=[16, 16, 32, 32], stage_out_channels=[32, 64, 128, 256],
             stage_num_blocks=[1, 1, 1, 1], stage_numb_of_layers=[2, 2, 2, 2],
             stage_downsample=[False, True, True, True], stage_light_block=[False, False, True, True],
             stage_kernel_size=[3, 3, 5, 5], use_learnable_affine_block=True, out_indices=[2, 3, 4],
             hidden_sizes=[32, 64, 128, 256], embedding_size=16)
# DEIMv2's DINOv3 variants: a ViT (patch 16, 4 registers, RoPE) whose stages 2, 3, 4 feed the fusion; no
# trailing conv in the CSP layers; the RoPE's training augmentation off (it draws random numbers)
DINOV3 = dict(model_type="dinov3_vit", hidden_size=48, intermediate_size=96, num_hidden_layers=4,
              num_attention_heads=4, num_register_tokens=4, patch_size=16, out_indices=[2, 3, 4],
              pos_embed_rescale=None)


# DEIMv2's lite encoder (Atto / Femto / Pico): HGNetV2's last two stages (strides 16, 32), two decoder levels
LITE = dict(backbone_config={**HGNET, "out_indices": [3, 4]}, encoder_type="lite", encoder_in_channels=[128, 256],
            feat_strides=[16, 32], num_feature_levels=2, decoder_in_channels=[32, 32])


def config(backbone=None, vit=None, **kw):
    dinov3 = backbone == "dinov3"
    if backbone == "lite":
        kw = {**LITE, **kw}
    return Deimv2Config(**{**dict(
        backbone_config={**DINOV3, **(vit or {})} if dinov3 else HGNET, encoder_in_channels=[32, 32, 32] if dinov3 else [64, 128, 256],
        encoder_hidden_dim=32, d_model=32, decoder_in_channels=[32, 32, 32], encoder_ffn_dim=64, decoder_ffn_dim=64,
        decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4, num_queries=30, num_labels=5,
        num_denoising=20, depth_mult=0.34, spatial_tuning_adapter_inplanes=8,
        encoder_has_trailing_conv=not dinov3), **kw})


def reference(seed=0, backbone=None, vit=None, **kw):
    cfg = config(backbone, vit, **kw)
    hf = Deimv2ForObjectDetection(cfg)
    rope = {n: b.clone() for n, b in hf.named_buffers() if "rope_embeddings" in n}
    perturb(hf, seed=seed)
    with torch.no_grad():  # constant buffers (1 / points, RoPE frequencies), not weights
        for layer in hf.model.decoder.layers:
            layer.encoder_attn.num_points_scale.fill_(1.0 / cfg.decoder_n_points)
        for n, b in hf.named_buffers():
            if n in rope:
                b.copy_(rope[n])
    return hf.eval()


def unambiguous(hf, x):
    """The top-k selection is unique: no tie among the 31 best encoder scores (zeroed invalid anchors give equal
    scores, and a tie lets either implementation pick either token)."""
    with torch.no_grad():
        best = hf(pixel_values=x).enc_outputs_class.max(-1).values.topk(hf.config.num_queries + 1, -1).values
    assert (best[:, :-1] - best[:, 1:]).min() > 1e-6


@pytest.mark.parametrize("backbone, seed, kw", [
    (None, 0, {}),
    (None, 9, {"decoder_method": "discrete", "use_gateway": False, "share_bbox_head": True,
               "encoder_has_trailing_conv": False}),  # seeds 0-8 tie in the top-k or give boxes of one height
    ("dinov3", 0, {}),
    ("lite", 0, {}),  # two levels (60 tokens at 96x128): other seeds tie in the top-k
])
def test_deimv2_eval_equals_transformers(backbone, seed, kw):
    hf = reference(seed=seed, backbone=backbone, **kw)
    unambiguous(hf, images())
    ours = load_detr(hf)
    assert isinstance(ours, DEIMv2) and isinstance(ours.backbone, DINOv3Backbone) == (backbone == "dinov3")
    assert isinstance(ours.encoder, LiteEncoder) == (backbone == "lite")
    check_eval(ours, hf, images(), f"DEIMv2 {backbone or 'hgnetv2'} {kw or 'default'}", num_aux=0)


@pytest.mark.parametrize("vit", [{"apply_layernorm": False}, {"apply_layernorm": False, "out_indices": [1, 2, 3]},
                                 {"key_bias": True}, {"proj_bias": False, "mlp_bias": False, "use_gated_mlp": True,
                                                      "hidden_act": "silu"}])
def test_deimv2_dinov3_options_equal_transformers(vit):
    """``apply_layernorm=False`` (DEIMv2's distilled ViT-Tiny variants): only the last block's output normed, so
    out_indices [1, 2, 3] of 4 blocks take none through the norm; ``key_bias=True`` (DEIMv2-L / X's config) with
    the key biases zero, as DINOv3's; a gated MLP (DEIMv2-X's ViT-S+) without projection and MLP biases."""
    hf = reference(seed=5, backbone="dinov3", vit=vit)
    if vit.get("key_bias"):
        with torch.no_grad():
            for layer in hf.model.conv_encoder.backbone.model.layer:
                layer.attention.k_proj.bias.zero_()
    unambiguous(hf, images())
    check_eval(load_detr(hf), hf, images(), f"DEIMv2 dinov3 {vit}", num_aux=0)


def test_deimv2_dinov3_refuses_a_nonzero_key_bias():
    hf = reference(seed=5, backbone="dinov3", vit={"key_bias": True})  # perturbed: nonzero
    with pytest.raises(ValueError, match=r"model\.conv_encoder\.backbone\.model\.layer\.0\.attention\.k_proj\.bias: "
                                         "a nonzero key bias"):
        load_detr(hf)


def test_deimv2_state_dict_with_config_loads_the_same_model():
    hf = reference(seed=3, backbone="dinov3")
    check_eval(load_detr(hf.state_dict(), hf.config), hf, images(), "DEIMv2 dinov3, state_dict + config", num_aux=0)
    state = dict(hf.state_dict())
    state["model.decoder.extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"unused \['decoder.extra.weight'\]"):
        load_detr(state, hf.config)


@pytest.mark.parametrize("backbone, size", [(None, (128, 64)), ("dinov3", (64, 160)), ("lite", (160, 96))])
def test_deimv2_at_other_non_square_sizes_equals_transformers(backbone, size):
    """transformers (eval_size None) computes AIFI's table, DINOv3's RoPE and the anchors at the input's size."""
    hf = reference(seed=2, backbone=backbone)
    check_eval(load_detr(hf), hf, images(*size), f"DEIMv2 {backbone or 'hgnetv2'} at {size}", num_aux=0)


@pytest.mark.parametrize("backbone", [None, "dinov3", "lite"])
def test_deimv2_training_with_denoising_equals_transformers(backbone):
    hf = reference(seed=4, backbone=backbone)
    ours = load_detr(hf)
    x = images()
    boxes = [torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.3, 0.2]]), torch.tensor([[0.5, 0.5, 0.4, 0.4]])]
    labels = [torch.tensor([1, 3]), torch.tensor([4])]
    want, got = train_both(hf, ours, x, boxes, labels, seed=5)
    P = want.denoising_meta_values["dn_num_split"][0]
    layers = [*got["aux_outputs"], got]  # the pre-box head's, then layers 0..2
    assert len(layers) == want.intermediate_logits.shape[1] == 4 and P > 0
    errs = {}
    for i, out in enumerate(layers):
        errs[f"layer{i}_logits"] = diff(out["pred_logits"], want.intermediate_logits[:, i, P:])
        errs[f"layer{i}_boxes"] = diff(out["pred_boxes"], want.intermediate_reference_points[:, i, P:])
        errs[f"dn{i}_logits"] = diff(got["dn_outputs"][i]["pred_logits"], want.intermediate_logits[:, i, :P])
        errs[f"dn{i}_boxes"] = diff(got["dn_outputs"][i]["pred_boxes"], want.intermediate_reference_points[:, i, :P])
    scale = want.intermediate_logits.abs().max().item()
    print(f"\nDEIMv2 {backbone or 'hgnetv2'} training with denoising (logits up to {scale:.1f}): max abs diff "
          + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    assert max(v for k, v in errs.items() if "boxes" in k) < ATOL, errs
    # HGNetV2 was 4.2e-4 here: AIFI's sin-cos in float32 (transformers': float64, one ulp apart) and AIFI's output
    # fed to the fusion with channels-last strides (another CPU conv kernel), each amplified by the neck's
    # batch-statistics BatchNorm; both fixed (sincos.py, deimv2_neck.py; the neck test below): 1.8e-6
    assert max(v for k, v in errs.items() if "logits" in k) < ATOL, errs


def test_deimv2_neck_in_training_equals_transformers_on_equal_inputs():
    """The fusion (AIFI, then DEIMv2's blocks) in training mode, batch-statistics BatchNorm, on equal maps: how a
    rounding difference would be amplified is shown by transformers' own forward, whose logits move by 2.5e-4
    when its AIFI output moves by one ulp (seed 4, the training test's model)."""
    hf = reference(seed=4)
    ours = load_detr(hf)
    hf.train()
    ours.train()
    g = torch.Generator().manual_seed(1)
    maps = [torch.randn(2, 32, 12, 16, generator=g), torch.randn(2, 32, 6, 8, generator=g),
            torch.randn(2, 32, 3, 4, generator=g)]
    with torch.no_grad():
        want = hf.model.encoder([m.clone() for m in maps]).feature_maps
        got = ours.encoder.ccfm([*maps[:2], ours.encoder.aifi[0](maps[2])])
    errs = [diff(a, b) for a, b in zip(got, want)]
    print(f"\nDEIMv2 neck, training mode, equal inputs: max abs diff per level {errs}")
    assert max(errs) < 1e-6, errs


def test_deimv2_training_forward_in_float64_equals_transformers():
    """The training forward (batch-statistics BatchNorm) in float64, no denoising: what is left is transformers'
    RMSNorm, which computes in float32 whatever the input's dtype (4e-7 in evaluation too)."""
    hf = reference(seed=4)
    ours = load_detr(hf)
    hf.double().train()
    ours.double().train()
    x = images().double()
    with torch.no_grad():
        want, got = hf.model(pixel_values=x), ours(x)
    layers = [*got["aux_outputs"], got]
    errs = {f"layer{i}_logits": diff(out["pred_logits"], want.intermediate_logits[:, i]) for i, out in enumerate(layers)}
    errs.update({f"layer{i}_boxes": diff(out["pred_boxes"], want.intermediate_reference_points[:, i])
                 for i, out in enumerate(layers)})
    errs["enc_logits"] = diff(got["enc_outputs"]["pred_logits"], want.enc_topk_logits)
    print("\nDEIMv2 hgnetv2 training forward, float64: max abs diff " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    assert max(errs.values()) < 1e-5, errs


def loss_of(out):
    return out["pred_logits"].sigmoid().mean() + out["pred_boxes"].mean() + out["enc_outputs"]["pred_boxes"].mean() \
        + sum(a["pred_logits"].sigmoid().mean() for a in out["aux_outputs"])


@pytest.mark.parametrize("part, name", [("aifi", "rope_mixed"), ("backbone", "rope_mixed"), ("backbone", "none")])
def test_swapping_an_encoding_by_name_after_loading_changes_outputs_and_trains_a_step(part, name):
    hf = reference(seed=6, backbone="dinov3")
    model = load_detr(hf)
    x = images()
    with torch.no_grad():
        before = model.eval()(x)["pred_logits"]
    model.set_encoding(name, part=part)
    if part == "backbone":
        assert model.backbone.vit.pe_name == name
    else:
        assert {layer.self_attn.pe.family for layer in model.encoder.aifi[0].layers} == {"rotary"}
    with torch.no_grad():
        after = model.eval()(x)["pred_logits"]
    assert (after - before).abs().max() > 1e-3  # the position changed the outputs
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    model.train()
    first = loss_of(model(x))
    opt.zero_grad()
    first.backward()
    grads = [p.grad for n, p in model.named_parameters() if p.requires_grad and ".pe." in n]
    assert name == "none" or (grads and all(g is not None and g.abs().sum() > 0 for g in grads))
    opt.step()
    with torch.no_grad():
        assert loss_of(model(x)).item() != first.item()


def test_swapping_the_backbone_encoding_needs_a_backbone_that_has_one():
    model = load_detr(reference(seed=1))
    with pytest.raises(ValueError, match="part='backbone'"):
        model.set_encoding("rope_mixed", part="backbone")
    with pytest.raises(ValueError, match="part='neck'"):
        model.set_encoding("rope_mixed", part="neck")


@pytest.mark.parametrize("backbone, kw, match", [
    ("dinov3", {"encoder_type": "lite"}, "encoder_type='lite' with a dinov3_vit backbone"),
    (None, {"encoder_fuse_op": "cat"}, "encoder_fuse_op='cat'")])
def test_loader_refuses_what_it_does_not_build(backbone, kw, match):
    with pytest.raises(ValueError, match=match):
        load_detr(Deimv2ForObjectDetection(config(backbone, **kw)))


def test_lite_encoder_has_no_position_to_swap_and_takes_no_aifi_arguments():
    """The lite encoder has no attention: swapping its encoding is refused, and so are AIFI's arguments."""
    model = load_detr(reference(seed=1, backbone="lite"))
    assert isinstance(model.encoder, LiteEncoder)
    with pytest.raises(ValueError, match="lite encoder has no attention"):
        model.set_encoding("rope_mixed")
    with pytest.raises(ValueError, match=r"\['pe'\] with deimv2 encoder='lite'"):
        DEIMv2(model.backbone, 5, deimv2={"encoder": "lite"}, pe="rope_mixed", dfine={})
    with pytest.raises(ValueError, match="deimv2 encoder='tiny'"):
        DEIMv2(model.backbone, 5, deimv2={"encoder": "tiny"}, dfine={})


@pytest.mark.slow
@pytest.mark.parametrize("backbone", [None, "dinov3"])
def test_deimv2_from_the_default_config_equals_transformers(backbone):
    """Deimv2Config's defaults (HGNetV2, d_model 256, 6 decoder layers) with num_queries=30; the DINOv3 variant
    with DINOv3ViTConfig's defaults (ViT-S/16, RoPE augmentation as configured: evaluation draws none), 4
    registers (the released models'), stages 6, 9, 12 and no trailing conv, as DEIMv2's DINOv3 models."""
    kw = {} if backbone is None else dict(
        backbone_config={"model_type": "dinov3_vit", "out_indices": [6, 9, 12], "num_register_tokens": 4},
        encoder_has_trailing_conv=False)
    cfg = Deimv2Config(num_queries=30, **kw)
    hf = Deimv2ForObjectDetection(cfg)
    rope = {n: b.clone() for n, b in hf.named_buffers() if "rope_embeddings" in n}
    perturb(hf, seed=0)
    with torch.no_grad():
        for layer in hf.model.decoder.layers:
            layer.encoder_attn.num_points_scale.fill_(1.0 / cfg.decoder_n_points)
        for n, b in hf.named_buffers():
            if n in rope:
                b.copy_(rope[n])
    hf.eval()
    unambiguous(hf, images())
    check_eval(load_detr(hf), hf, images(), f"DEIMv2 default config, {backbone or 'hgnetv2'}", num_aux=0)


def test_eval_size_set_vispe_keeps_the_position_transformers_drops_it():
    """transformers' DEIMv2 AIFI (as RT-DETR's) passes no position in evaluation when ``eval_size`` is set; vispe
    computes it at the input's size, so it equals transformers with ``eval_size=None``."""
    hf_eval_size = reference(seed=4, eval_size=[640, 640])
    ours = load_detr(hf_eval_size)
    same = Deimv2ForObjectDetection(config()).eval()
    same.load_state_dict(hf_eval_size.state_dict())
    check_eval(ours, same, images(), "DEIMv2, eval_size set, against eval_size None", num_aux=0)
    with torch.no_grad():
        dropped = hf_eval_size(pixel_values=images()).logits
        kept = same(pixel_values=images()).logits
        got = ours(images())["pred_logits"]
    # without AIFI's position the logits move by 4.5e-5 in this small random model (RT-DETR's: 6.5e-3), about
    # 30x vispe's difference from transformers with the position (1.4e-6)
    assert diff(got, dropped) > 10 * diff(got, kept)
