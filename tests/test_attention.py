"""vispe.attention.Attention against a plain reference attention written here."""
import math

import pytest
import torch
from timm.layers import Attention as TimmAttention

from vispe.attention import Attention, PosContext
from vispe.axis.rope import apply_rope, rope_angles
from vispe.encoding import AdditiveEncoding, BiasEncoding, RotaryEncoding

torch.manual_seed(0)
DIM, HEADS = 32, 4
HD = DIM // HEADS


class FixedRope(RotaryEncoding):
    """Test encoding: 1D RoPE over the row-major token index (any rotary encoding would do)."""

    def __init__(self):
        super().__init__()
        self.head_dim, self.num_heads = HD, 1

    def forward(self, shape, mask=None, *, device=None):
        n = shape[0] * shape[1]
        return rope_angles(torch.arange(n, device=device).float(), HD)[None, None]  # (1, 1, N, HD/2)


class TableBias(BiasEncoding):
    """Test encoding: a random (heads, L, L) table for a fixed sequence length."""

    def __init__(self, L, P=0):
        super().__init__()
        self.num_heads, self.num_prefix_tokens = HEADS, P
        self.table = torch.nn.Parameter(torch.randn(HEADS, L, L))

    def forward(self, shape, mask=None, *, device=None, dtype=None, q=None):
        return self.table[None].to(dtype)


def reference(attn, x, *, pos=None, angles=None, bias=None, kpm=None):
    """softmax((q k^T) / sqrt(d) + bias) v in float64, q = k from x + pos, v from x."""
    a = attn.double()
    B, L, C = x.shape
    W, bqkv = a.qkv.weight, a.qkv.bias
    xd = x.double()
    xq = xd if pos is None else xd + pos.double()
    q = (xq @ W[:C].T + bqkv[:C]).view(B, L, HEADS, HD).transpose(1, 2)
    k = (xq @ W[C:2 * C].T + bqkv[C:2 * C]).view(B, L, HEADS, HD).transpose(1, 2)
    v = (xd @ W[2 * C:].T + bqkv[2 * C:]).view(B, L, HEADS, HD).transpose(1, 2)
    if angles is not None:
        q, k = apply_rope(q, angles.double()), apply_rope(k, angles.double())
    s = q @ k.transpose(-1, -2) / math.sqrt(HD)
    if bias is not None:
        s = s + bias.double()
    if kpm is not None:
        s = s.masked_fill(kpm[:, None, None, :], float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, C)
    out = a.proj(o)
    attn.float()
    return out.float()


def make(pe=None):
    return Attention(DIM, HEADS, qkv_bias=True, pe=pe).eval()


def test_no_encoding_equals_timm_attention():
    ours = make()
    timm_attn = TimmAttention(DIM, num_heads=HEADS, qkv_bias=True).eval()
    timm_attn.load_state_dict(ours.state_dict())
    x = torch.randn(2, 7, DIM)
    torch.testing.assert_close(ours(x), timm_attn(x), rtol=1e-5, atol=1e-5)
    assert set(ours.state_dict()) == set(timm_attn.state_dict())


def test_additive_every_layer_adds_pos_to_q_and_k_only():
    attn = make()
    x, pos = torch.randn(2, 6, DIM), torch.randn(1, 6, DIM)
    out = attn(x, ctx=PosContext((2, 3), pos=pos))
    torch.testing.assert_close(out, reference(attn, x, pos=pos), rtol=1e-4, atol=1e-5)


def test_rotary_matches_reference_and_leaves_prefix_unrotated():
    attn = make(FixedRope())
    P, (h, w) = 1, (2, 3)
    x = torch.randn(2, P + h * w, DIM)
    out = attn(x, ctx=PosContext((h, w), num_prefix_tokens=P))
    angles = torch.cat([torch.zeros(1, 1, P, HD // 2), rope_angles(torch.arange(h * w).float(), HD)[None, None]], 2)
    torch.testing.assert_close(out, reference(attn, x, angles=angles), rtol=1e-4, atol=1e-5)


def test_bias_matches_reference():
    L = 7
    attn = make(TableBias(L, P=1))
    x = torch.randn(2, L, DIM)
    out = attn(x, ctx=PosContext((2, 3), num_prefix_tokens=1))
    torch.testing.assert_close(out, reference(attn, x, bias=attn.pe.table[None]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("with_bias", [False, True])
def test_key_padding_mask_matches_reference_and_padding_does_not_leak(with_bias):
    h, w = 2, 3
    attn = make(TableBias(1 + h * w, P=1) if with_bias else None)
    x = torch.randn(2, 1 + h * w, DIM)
    mask = torch.zeros(2, h, w, dtype=torch.bool)
    mask[1, :, 2] = True  # last column of image 1 is padding
    ctx = PosContext((h, w), num_prefix_tokens=1, mask=mask)
    out = attn(x, ctx=ctx)
    bias = attn.pe.table[None] if with_bias else None
    torch.testing.assert_close(out, reference(attn, x, bias=bias, kpm=ctx.key_padding_mask), rtol=1e-4, atol=1e-5)
    # Changing the padded tokens changes nothing on the valid ones.
    x2 = x.clone()
    x2[1, 1:].view(h, w, DIM)[:, 2] = 100.0
    out2 = attn(x2, ctx=ctx)
    valid = torch.cat([torch.tensor([True]), ~mask[1].flatten()])
    torch.testing.assert_close(out2[1, valid], out[1, valid])


def test_fully_padded_image_gives_no_nan():
    attn = make()
    mask = torch.ones(1, 2, 2, dtype=torch.bool)
    out = attn(torch.randn(1, 4, DIM), ctx=PosContext((2, 2), mask=mask))
    assert torch.isfinite(out).all()


def test_backward_reaches_encoding_parameters():
    attn = make(TableBias(6))
    attn(torch.randn(2, 6, DIM), ctx=PosContext((2, 3))).sum().backward()
    assert attn.pe.table.grad is not None and attn.pe.table.grad.abs().sum() > 0


def test_bad_input_is_refused_clearly():
    class Add(AdditiveEncoding):
        dim = DIM

    with pytest.raises(ValueError, match="family='additive'"):
        make(Add())
    bad = FixedRope()
    bad.head_dim = HD * 2
    with pytest.raises(ValueError, match="head_dim"):
        make(bad)
    with pytest.raises(ValueError, match="dim=30"):
        Attention(30, 4)
    with pytest.raises(ValueError, match="PosContext"):
        make(FixedRope())(torch.randn(1, 4, DIM))
    with pytest.raises(ValueError, match="ctx.pos"):
        make()(torch.randn(1, 4, DIM), ctx=PosContext((2, 2), pos=torch.randn(1, 5, DIM)))


def cross_reference(attn, x, mem, *, qpos=None, kpos=None, kpm=None):
    """Cross-attention in float64: q from x + qpos, k from mem + kpos, v from mem (DETR's decoder)."""
    a = attn.double()
    B, Lq, C = x.shape
    Lk = mem.shape[1]
    W, b = a.qkv.weight, a.qkv.bias
    xq = x.double() + (0 if qpos is None else qpos.double())
    mk = mem.double() + (0 if kpos is None else kpos.double())
    q = (xq @ W[:C].T + b[:C]).view(B, Lq, HEADS, HD).transpose(1, 2)
    k = (mk @ W[C:2 * C].T + b[C:2 * C]).view(B, Lk, HEADS, HD).transpose(1, 2)
    v = (mem.double() @ W[2 * C:].T + b[2 * C:]).view(B, Lk, HEADS, HD).transpose(1, 2)
    s = q @ k.transpose(-1, -2) / math.sqrt(HD)
    if kpm is not None:
        s = s.masked_fill(kpm[:, None, None, :], float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, Lq, C)
    out = a.proj(o)
    attn.float()
    return out.float()


def test_cross_attention_query_and_key_positions_apart_with_key_padding():
    attn = make()
    x, mem = torch.randn(2, 5, DIM), torch.randn(2, 6, DIM)  # 5 queries, memory of a 2x3 grid
    qpos, kpos = torch.randn(1, 5, DIM), torch.randn(2, 6, DIM)
    mask = torch.zeros(2, 2, 3, dtype=torch.bool)
    mask[1, :, 2] = True  # image 1: last column is padding
    out = attn(x, ctx=PosContext(pos=qpos), memory=mem, memory_ctx=PosContext((2, 3), mask=mask, pos=kpos))
    ref = cross_reference(attn, x, mem, qpos=qpos, kpos=kpos, kpm=mask.flatten(1))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    # the query position reaches q only: changing it changes the output; the memory's padded keys do not matter
    mem2 = mem.clone()
    mem2[1].view(2, 3, DIM)[:, 2] += 5.0
    out2 = attn(x, ctx=PosContext(pos=qpos), memory=mem2, memory_ctx=PosContext((2, 3), mask=mask, pos=kpos))
    torch.testing.assert_close(out2, out, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(attn(x, memory=mem, memory_ctx=PosContext((2, 3), mask=mask, pos=kpos)), out, atol=1e-3)


def test_cross_attention_without_positions_equals_torch_multihead_attention():
    attn = make()
    mha = torch.nn.MultiheadAttention(DIM, HEADS, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(attn.qkv.weight)
        mha.in_proj_bias.copy_(attn.qkv.bias)
        mha.out_proj.weight.copy_(attn.proj.weight)
        mha.out_proj.bias.copy_(attn.proj.bias)
    x, mem = torch.randn(2, 4, DIM), torch.randn(2, 9, DIM)
    kpm = torch.zeros(2, 9, dtype=torch.bool)
    kpm[0, 6:] = True
    ours = attn(x, memory=mem, memory_ctx=PosContext((3, 3), mask=kpm.view(2, 3, 3)))
    ref, _ = mha(x, mem, mem, key_padding_mask=kpm)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_cross_attention_refuses_rotary_without_query_coords_and_bad_shapes():
    # a rotary layer rotates queries at ctx.coords (positioned queries): without them it refuses
    with pytest.raises(ValueError, match=r"cross-attention needs memory_ctx .* and ctx.coords"):
        make(FixedRope())(torch.randn(1, 3, DIM), ctx=PosContext((1, 3)), memory=torch.randn(1, 4, DIM))
    with pytest.raises(ValueError, match=r"memory has shape \(2, 4, 32\)"):
        make()(torch.randn(1, 3, DIM), memory=torch.randn(2, 4, DIM))
    with pytest.raises(ValueError, match=r"memory_ctx.pos has shape"):
        make()(torch.randn(1, 3, DIM), memory=torch.randn(1, 4, DIM), memory_ctx=PosContext(pos=torch.randn(1, 5, DIM)))
    with pytest.raises(ValueError, match="memory_ctx is given without memory"):
        make()(torch.randn(1, 3, DIM), memory_ctx=PosContext((1, 3)))
