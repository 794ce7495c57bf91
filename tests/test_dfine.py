"""vispe's D-FINE (``RTDETR(dfine=...)``: D-FINE's fusion blocks, FDR / LQE decoder, transformers' HGNetV2
wrapped) against transformers' DFineForObjectDetection from a small config with random weights, every
parameter perturbed (``up`` and ``reg_scale`` included), num_queries=30, a non-square batch: eval logits and
boxes, training with denoising seeded alike (every layer, the pre-box head's, the denoising queries)."""
import pytest
import torch
from test_deformable_encoder import perturb
from test_rtdetr import ATOL, check_eval, diff, images, train_both
from transformers import DFineConfig, DFineForObjectDetection

from vispe.models.detr import load_detr
from vispe.models.detr.realtime import RTDETR
from vispe.models.detr.realtime.dfine_decoder import weighting_function


def config(**kw):
    backbone = dict(model_type="hgnet_v2", stem_channels=[3, 16, 16], stage_in_channels=[16, 32, 64, 128],
                    stage_mid_channels=[16, 16, 32, 32], stage_out_channels=[32, 64, 128, 256],
                    stage_num_blocks=[1, 1, 1, 1], stage_numb_of_layers=[2, 2, 2, 2],
                    stage_downsample=[False, True, True, True], stage_light_block=[False, False, True, True],
                    stage_kernel_size=[3, 3, 5, 5], use_learnable_affine_block=True, out_indices=[2, 3, 4],
                    hidden_sizes=[32, 64, 128, 256], embedding_size=16)
    return DFineConfig(**{**dict(backbone_config=backbone, encoder_in_channels=[64, 128, 256], encoder_hidden_dim=32,
                                 d_model=32, decoder_in_channels=[32, 32, 32], encoder_ffn_dim=64, decoder_ffn_dim=64,
                                 decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4, num_queries=30,
                                 num_labels=5, num_denoising=20, depth_mult=0.34), **kw})


def reference(seed=0, **kw):
    cfg = config(**kw)
    hf = perturb(DFineForObjectDetection(cfg), seed=seed).eval()
    with torch.no_grad():  # a constant buffer (1 / points), not a weight
        for layer in hf.model.decoder.layers:
            layer.encoder_attn.num_points_scale.fill_(1.0 / cfg.decoder_n_points)
    return hf


@pytest.mark.parametrize("size, kw", [((96, 128), {}), ((64, 160), {"decoder_method": "discrete"})])
def test_dfine_eval_equals_transformers(size, kw):
    hf = reference(**kw)
    ours = load_detr(hf)
    assert isinstance(ours, RTDETR)
    check_eval(ours, hf, images(*size), f"D-FINE {kw or 'default'}", num_aux=0)  # evaluation: the last layer only
    check_eval(load_detr(hf.state_dict(), hf.config), hf, images(*size), "D-FINE, state_dict + config", num_aux=0)


def test_dfine_training_with_denoising_equals_transformers():
    hf = reference(seed=2)
    ours = load_detr(hf)
    x = images()
    boxes = [torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.3, 0.2]]), torch.tensor([[0.5, 0.5, 0.4, 0.4]])]
    labels = [torch.tensor([1, 3]), torch.tensor([4])]
    want, got = train_both(hf, ours, x, boxes, labels, seed=5)
    P = want.denoising_meta_values["dn_num_split"][0]
    layers = [*got["aux_outputs"], got]  # the pre-box head's, then layers 0..2
    assert len(layers) == want.intermediate_logits.shape[1] == 4
    errs = {}
    for i, out in enumerate(layers):
        errs[f"layer{i}_logits"] = diff(out["pred_logits"], want.intermediate_logits[:, i, P:])
        errs[f"layer{i}_boxes"] = diff(out["pred_boxes"], want.intermediate_reference_points[:, i, P:])
        errs[f"dn{i}_logits"] = diff(got["dn_outputs"][i]["pred_logits"], want.intermediate_logits[:, i, :P])
        errs[f"dn{i}_boxes"] = diff(got["dn_outputs"][i]["pred_boxes"], want.intermediate_reference_points[:, i, :P])
    print("\nD-FINE training with denoising: max abs diff " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    scale = want.intermediate_logits.abs().max().item()
    print(f"D-FINE training: logits up to {scale:.1f}")
    # training normalises D-FINE's neck by batch statistics (a batch of 2, depthwise SCDown): float rounding comes
    # out larger than in evaluation (1e-6 there); the bound is 1e-4 relative to the logits' largest magnitude
    assert max(v for k, v in errs.items() if "boxes" in k) < ATOL, errs
    assert max(v for k, v in errs.items() if "logits" in k) < ATOL * max(1.0, scale), errs


def test_weighting_function_equals_the_papers_formula():
    """W(n) for N = 32 bins, up 0.5, reg_scale 4 (D-FINE's defaults), from the paper's Eq. (4) written out."""
    w = weighting_function(32, torch.tensor([0.5]), torch.tensor([4.0]))
    c, a = 0.5 * 4.0, 2 * 0.5 * 4.0  # transformers' upper bounds: up * reg_scale and twice it
    step = (c + 1) ** (2 / 30)
    want = [-a] + [-(step ** i) + 1 for i in range(15, 0, -1)] + [0.0] + [step ** i - 1 for i in range(1, 16)] + [a]
    torch.testing.assert_close(w, torch.tensor(want), rtol=0, atol=1e-6)
    assert len(w) == 33 and w[16] == 0 and torch.all(w[1:] > w[:-1])


def test_loader_refuses_an_earlier_evaluation_layer():
    with pytest.raises(ValueError, match="eval_idx"):
        load_detr(DFineForObjectDetection(config(eval_idx=1)))
