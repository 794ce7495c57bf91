"""vispe.kernels.rope (the attention's default RoPE path) against vispe.axis.rope.apply_rope."""
import pytest
import torch

from vispe.attention import Attention, PosContext
from vispe.axis.rope import apply_rope
from vispe.image.rope_axial import RopeAxial
from vispe.image.rope_mixed import RopeMixed
from vispe.kernels import set_impl
from vispe.kernels.rope import rope_tables, rotate, rotate_qk, tables_for
from vispe.models.vit import create_vit

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("angle_shape", [(1, 3, 7, 4), (2, 1, 7, 4)])
def test_rotate_equals_apply_rope_outputs_and_gradients(layout, angle_shape):
    torch.manual_seed(0)
    qk = torch.randn(2, 2, 3, 7, 8, requires_grad=True)  # (q|k, B, H, L, d)
    angles = (torch.randn(angle_shape) * 3).requires_grad_()
    g = torch.randn(2, 2, 3, 7, 8)
    ref = apply_rope(qk, angles, layout)
    gx_ref, ga_ref = torch.autograd.grad(ref, (qk, angles), g)
    cos, sin = rope_tables(angles.detach())
    out = rotate(qk, cos, sin, layout, angles=angles)
    gx, ga = torch.autograd.grad(out, (qk, angles), g)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(gx, gx_ref, **TOL)
    torch.testing.assert_close(ga, ga_ref, **TOL)


def test_rotate_keeps_dtype_and_matches_the_reference_in_bfloat16_and_float64():
    torch.manual_seed(0)
    angles = torch.randn(1, 1, 5, 4, dtype=torch.float64)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    cos, sin = rope_tables(angles)
    assert cos.dtype == torch.float64
    torch.testing.assert_close(rotate(x, cos, sin), apply_rope(x, angles), rtol=1e-12, atol=1e-12)
    xb = x.bfloat16()
    c32, s32 = rope_tables(angles.float())
    out = rotate(xb, c32, s32)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, apply_rope(xb, angles.float()), rtol=0, atol=0)  # same float32 math, one rounding


def test_rope_tables_prefix_rows_are_unrotated():
    cos, sin = rope_tables(torch.randn(1, 2, 4, 3), num_prefix_tokens=2)
    assert cos.shape == (1, 2, 6, 3)
    assert torch.equal(cos[:, :, :2], torch.ones(1, 2, 2, 3)) and torch.equal(sin[:, :, :2], torch.zeros(1, 2, 2, 3))


def _pair(pe_cls, impl_a, impl_b, mask=None, P=1, **kw):
    torch.manual_seed(0)
    attn = Attention(32, 4, qkv_bias=True, pe=pe_cls(8, 4, **kw))
    x = torch.randn(2, P + 12, 32, requires_grad=True)
    outs = []
    for impl in (impl_a, impl_b):
        attn.rope_impl = impl
        attn.zero_grad()
        out = attn(x, ctx=PosContext((3, 4), P, mask))
        gx, = torch.autograd.grad(out.square().sum(), x, retain_graph=True)
        out.square().sum().backward()
        outs.append((out, gx, {n: p.grad.clone() for n, p in attn.named_parameters()}))
    return outs


@pytest.mark.parametrize("pe_cls", [RopeAxial, RopeMixed])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_fused_path_equals_reference_path(pe_cls, masked):
    mask = None
    if masked:
        mask = torch.zeros(2, 3, 4, dtype=torch.bool)
        mask[1, :, 3] = True
    (o1, g1, p1), (o2, g2, p2) = _pair(pe_cls, "reference", "fused", mask=mask, coords="normalized")
    torch.testing.assert_close(o2, o1, **TOL)
    torch.testing.assert_close(g2, g1, **TOL)
    assert p1.keys() == p2.keys() and ("pe.freqs" in p1) == (pe_cls is RopeMixed)
    for n in p1:
        torch.testing.assert_close(p2[n], p1[n], **TOL, msg=n)


def test_fixed_tables_are_built_once_per_grid_and_shared_between_layers(monkeypatch):
    import vispe.kernels.rope as kr

    calls = []
    orig = kr.rope_tables
    monkeypatch.setattr(kr, "rope_tables", lambda *a: calls.append(1) or orig(*a))
    m = create_vit("vit_pico", pe="rope_axial", img_size=16, patch_size=4, num_classes=3).eval()
    x = torch.randn(2, 3, 16, 16)
    ref = m(x)
    assert len(calls) == 1  # no mask: one cos/sin table, shared by the layers (memo) and in the first one's cache...
    torch.testing.assert_close(m(x), ref, rtol=0, atol=0)
    assert len(calls) == 1  # ...and none built on the next forward pass
    mask = torch.zeros(2, 16, 16, dtype=torch.bool)
    mask[1, :, 12:] = True
    calls.clear()
    out = m(x, mask=mask)
    assert len(calls) == 1  # with a mask: once per forward pass, shared by the layers
    set_impl(m, rope="reference")
    torch.testing.assert_close(out, m(x, mask=mask), **TOL)
    # augmentation makes the angles random: not fixed, not cached
    pe = RopeAxial(8, 2, jitter=0.1).train()
    assert pe.fixed_key() is None and RopeAxial(8, 2).fixed_key() == RopeAxial(8, 4).fixed_key()


def test_learned_angles_are_computed_once_per_layer_per_step(monkeypatch):
    calls = []
    orig = RopeMixed.angles
    monkeypatch.setattr(RopeMixed, "angles", lambda self, c: calls.append(1) or orig(self, c))
    m = create_vit("vit_pico", pe="rope_mixed", img_size=16, patch_size=4, num_classes=3)
    m(torch.randn(2, 3, 16, 16)).sum().backward()
    assert len(calls) == len(m.blocks)
    assert all(b.attn.pe.freqs.grad.abs().sum() > 0 for b in m.blocks)


def test_tables_for_returns_angles_only_when_they_learn():
    shape = (2, 3)
    cos, sin, angles = tables_for(RopeMixed(8, 2), shape, None, 1, torch.device("cpu"))
    assert angles is not None and angles.requires_grad and angles.shape == (1, 2, 7, 4)
    with torch.no_grad():
        assert tables_for(RopeMixed(8, 2), shape, None, 1, torch.device("cpu"))[2] is None
    assert tables_for(RopeAxial(8, 2), shape, None, 0, torch.device("cpu"))[2] is None


def test_set_impl_and_bad_arguments():
    m = create_vit("vit_pico", pe="rope_axial", img_size=16, patch_size=4, num_classes=3)
    assert set_impl(m, rope="reference") == len(m.blocks)
    assert all(b.attn.rope_impl == "reference" for b in m.blocks)
    with pytest.raises(ValueError, match="rope='fast'"):
        set_impl(m, rope="fast")
    with pytest.raises(ValueError, match="rope_impl='x'"):
        Attention(32, 4, rope_impl="x")
    with pytest.raises(ValueError, match="expected one shape ending in"):
        rotate(torch.randn(2, 3, 8), torch.randn(3, 3), torch.randn(3, 3))
    with pytest.raises(ValueError, match="token angles"):
        rotate_qk(RopeAxial(8, 2), torch.randn(2, 1, 2, 5, 8), (2, 3))


@pytest.mark.slow
def test_compiled_kernel_equals_fused_kernel():
    torch.manual_seed(0)
    qk = torch.randn(2, 2, 3, 7, 8, requires_grad=True)
    angles = torch.randn(1, 3, 7, 4, requires_grad=True)
    cos, sin = rope_tables(angles.detach())
    g = torch.randn_like(qk)
    res = []
    for impl in ("fused", "compiled"):
        out = rotate(qk, cos, sin, angles=angles, impl=impl)
        res.append((out, *torch.autograd.grad(out, (qk, angles), g)))
    for a, b in zip(*res):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
