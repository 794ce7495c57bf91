"""Inductor's generated code against eager, once per model family (issue 56): the frame counts of
tests/test_compile.py compile nothing (a backend that runs dynamo's graph as captured), and most of its
value checks use ``aot_eager`` (no code generation); the ViT with rope_mixed and relbias runs Inductor
there. Here each other family, forward, at one non-square size, padded where the family takes a mask:
a converted timm Eva (2D RoPE), the dense DETR (DAB queries, BoxRPB), the deformable detector, a
converted vision tower (Pixtral) and a ViT with a block rotation (STRING) and LookHere's bias (LieRE's
and ComRoPE's matrix exponential, which multiplies Inductor's kernels, compile with ``aot_eager`` in
tests/test_image_rotary_blocks_vit.py). On an empty Inductor cache (each fused group a C++ file for
g++) the five took 85 s (104 CPU-seconds; the deformable detector 30 s, the ViT 25 s) in one pytest
process inside the heavy-job lock on the shared 2-core AMD EPYC; about 20 s warm."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import load_compare_script


def _eva():
    import timm

    from vispe.models.vit import convert_vit

    m = timm.create_model("vit_small_patch16_rope_224", depth=1, embed_dim=32, num_heads=2, img_size=16, patch_size=4,
                          num_classes=3)
    torch.nn.init.normal_(m.head.weight)  # timm's head starts near zero: logits that show a difference
    return convert_vit(m), (torch.randn(2, 3, 16, 24),)


def _padded(h, w):
    mask = torch.zeros(2, h, w, dtype=torch.bool)
    mask[1, :, w // 2:] = True
    mask[1, 3 * h // 4:] = True
    return torch.randn(2, 3, h, w), mask


def _detr():
    from vispe.models.detr import create_detr

    m = create_detr(5, backbone="small_cnn", decoder="dab", box_bias="boxrpb", d_model=32, nheads=2, enc_layers=1,
                    dec_layers=1, dim_feedforward=32, num_queries=4)
    return m, _padded(64, 96)


def _deformable():
    from vispe.models.detr import create_detr

    m = create_detr(5, backbone="small_cnn", backbone_widths=(4, 8, 8), d_model=32, nheads=2, enc_layers=1,
                    dec_layers=1, dim_feedforward=32, num_queries=3, dropout=0.0, attention="deformable",
                    num_feature_levels=2, backbone_levels=1, n_points=2, decoder="deformable")
    return m, _padded(64, 96)


def _tower():
    from vispe.models.vit import convert_vit

    return convert_vit(load_compare_script("parity_towers").TOWERS["pixtral"].build("tiny")), (torch.randn(2, 3, 16, 24),)


def _blocks_vit():
    from vispe.models.vit import create_vit
    from vispe.registry import build_in

    m = create_vit("vit_pico", pe="string", pe_kwargs=dict(cayley_std=0.3), embed_dim=16, depth=2, num_heads=2,
                   img_size=(16, 20), patch_size=4, num_classes=3, class_token=True)
    ctx = dict(dim=16, num_heads=2, head_dim=8, grid=(4, 5), num_prefix_tokens=1)
    m.blocks[1].attn.set_pe(build_in("lookhere", ctx, layer=1, depth=2))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".attn.pe." in name:
                p.add_(torch.randn_like(p) * 0.1)
    return m, (torch.randn(2, 3, 16, 24),)


FAMILIES = {"eva": _eva, "detr": _detr, "deformable_detr": _deformable, "tower_pixtral": _tower, "block_vit": _blocks_vit}


def _leaves(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [v for k in sorted(out) for v in _leaves(out[k])]
    if isinstance(out, (list, tuple)):
        return [v for o in out for v in _leaves(o)]
    if hasattr(out, "last_hidden_state"):
        return [out.last_hidden_state]
    return []


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_inductor_output_equals_eager(family):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, args = FAMILIES[family]()
    model.eval()
    with torch.no_grad():
        want = _leaves(model(*args))
        got = _leaves(torch.compile(model, backend="inductor", dynamic=False)(*args))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert w.abs().max() > 1e-3  # a real output
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
