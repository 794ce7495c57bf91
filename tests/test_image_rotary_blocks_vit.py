"""Block-rotation encodings (issue 38) inside a whole ViT: float32 vs bfloat16 autocast, and
``torch.compile`` and ONNX export of one model with a block encoding per layer (the encodings
themselves against their references: test_image_rotary_blocks.py)."""
from __future__ import annotations

import copy

import pytest
import torch

from vispe.models.vit import create_vit


def _positions_seen(m, x, autocast: bool):
    """What every layer's encoding returned while a fresh copy of ``m`` ran ``x`` (forward hooks: the
    rotations or the bias the model applied, no cache read in between), and the logits."""
    m = copy.deepcopy(m)  # an empty table cache: each layer computes its positions in this pass
    seen = []
    for blk in m.blocks:
        blk.attn.pe.register_forward_hook(lambda mod, args, out: seen.append(out))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = m(x)
    return seen, logits


def _tensors(out) -> list[torch.Tensor]:
    """The tensors of an encoding's output: blocks, or the fields of a factored form (nested tuples)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


@pytest.mark.parametrize("pe", ["liere", "comrope", "string", "lookhere"])
def test_whole_vit_float32_and_bfloat16_autocast_agree(pe):
    """Rotations and biases are computed in float32 under autocast (the contract): the rotations the
    model applies under bfloat16 autocast are float32 and equal float32's to float32 rounding (a
    bfloat16 product would be off by ~1e-2), LookHere's bias is float32's cast once to bfloat16; the
    logits stay close."""
    torch.manual_seed(0)
    m = create_vit("vit_pico", pe=pe, embed_dim=32, depth=2, num_heads=2, img_size=(12, 16), patch_size=4,
                   num_classes=5, class_token=True).eval()
    with torch.no_grad():  # rotations that turn visibly across the grid, so that their rounding shows
        for name, p in m.named_parameters():
            if ".attn.pe." in name:
                p.add_(torch.randn_like(p) * 0.5)
    x = torch.randn(2, 3, 12, 16)
    ref_pos, ref = _positions_seen(m, x, autocast=False)
    low_pos, low = _positions_seen(m, x, autocast=True)
    assert len(ref_pos) == len(low_pos) == 2  # each layer computed its own
    for a, b in zip(low_pos, ref_pos):
        if pe == "lookhere":  # a bias is cast to the logits' dtype at the end: float32's, rounded once
            assert b.dtype == torch.float32 and (b - b[:, :, :1]).abs().max() > 0.1  # positions that vary
            assert a.dtype == torch.bfloat16 and torch.equal(a, b.to(torch.bfloat16))
            continue
        # the rotations as blocks, or in the factored form of issue 52 (vispe.kernels.rope_blocks:
        # STRING's angles and P, ComRoPE's t and Schur basis, LieRE's inputs): every tensor of it
        fa, fb = _tensors(a), _tensors(b)
        assert len(fa) == len(fb) > 0
        assert max(float(t.amax() - t.amin()) for t in fb if t.is_floating_point()) > 0.1  # positions that vary
        for ta, tb in zip(fa, fb):
            assert ta.dtype == tb.dtype and (ta.dtype == torch.float32 or not ta.is_floating_point())
            torch.testing.assert_close(ta, tb, rtol=1e-6, atol=1e-6)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), ref, rtol=0.05, atol=0.05)


# --- compile and export: one model, one block encoding per layer ------------------------------------
def _mixed_blocks_vit(depth=3):
    from vispe.registry import build_in

    torch.manual_seed(0)
    m = create_vit("vit_pico", pe="liere", pe_kwargs=dict(block_size=4), embed_dim=16, depth=depth, num_heads=2,
                   img_size=(16, 20), patch_size=4, num_classes=3, class_token=True, global_pool="avg")
    ctx = dict(dim=16, num_heads=2, head_dim=8, grid=(4, 5))
    encodings = [build_in("string", ctx, cayley_std=0.3),  # ComRoPE: the same kernel and exponential
                 build_in("lookhere", dict(ctx, num_prefix_tokens=1), layer=2, depth=3)]
    for blk, pe in zip(m.blocks[1:], encodings):
        blk.attn.set_pe(pe)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".attn.pe." in name:
                p.add_(torch.randn_like(p) * 0.1)
    return m


@pytest.mark.slow
def test_onnx_export_of_the_block_encodings_runs_at_any_size():
    """LieRE (4 x 4 blocks: the exponential), STRING (Cayley: the matmul-only inverse) and LookHere in
    one ViT, exported with dynamic batch, height and width, run at three sizes (as test_export.py,
    which leaves these out: one export instead of three); ComRoPE uses the same exponential and kernel."""
    import logging
    import warnings

    from vispe.export import export_onnx, onnx_session, run_onnx

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    m = _mixed_blocks_vit().eval()
    program = export_onnx(m)
    sess = onnx_session(program)
    for i, size in enumerate([(16, 20), (24, 8), (8, 12)]):
        x = torch.randn(3 if i % 2 else 2, 3, *size)
        with torch.no_grad():
            want = m(x)
            torch.testing.assert_close(program.exported_program.module()(x), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(run_onnx(sess, x), want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_compiled_block_encodings_train_at_two_sizes():
    """torch.compile (aot_eager) of a LieRE layer (the exponential) and a LookHere layer, forward and
    backward, at two sizes (test_compile.py leaves the four out)."""
    torch._dynamo.reset()
    m = _mixed_blocks_vit().train()
    m.blocks[1].attn.set_pe(m.blocks[2].attn.pe)
    m.blocks = m.blocks[:2]
    compiled = torch.compile(m, backend="aot_eager")
    for size in [(16, 20), (24, 8)]:
        x = torch.randn(2, 3, *size, requires_grad=True)
        out = compiled(x)
        torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-4)
        g_c, = torch.autograd.grad(out.square().sum(), x)
        g_e, = torch.autograd.grad(m(x).square().sum(), x)
        torch.testing.assert_close(g_c, g_e, rtol=1e-3, atol=1e-4)
