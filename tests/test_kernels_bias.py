"""vispe.kernels.bias_attention: every path against SDPA with the bias as a float mask."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from conftest import padded_bias_case
from vispe.attention import Attention
from vispe.kernels import set_impl
from vispe.kernels.bias_attention import attend, pick_impl
from vispe.models.vit import create_vit
from vispe.registry import build_in

TOL = dict(rtol=1e-5, atol=1e-5)


def _run(impl, q, k, v, bias, kpm=None, attn_mask=None, chunk_bytes=4 * 2**20):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]
    out = attend(*leaves[:3], bias=leaves[3], key_padding_mask=kpm, attn_mask=attn_mask, impl=impl,
                 chunk_bytes=chunk_bytes)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    return [out] + [t.grad for t in leaves]


@pytest.mark.parametrize("bias_batch", [1, 3])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("chunk_bytes", [4 * 2**20, 9 * 9 * 4, 2 * 9 * 4 * 3])  # one block; one head of one
# item per block; rows of one head per block
def test_chunked_equals_reference_outputs_and_gradients(bias_batch, padded, chunk_bytes):
    torch.manual_seed(0)
    B, H, L, d = 3, 2, 9, 8
    q, k, v = (torch.randn(B, H, L, d) for _ in range(3))
    bias = torch.randn(bias_batch, H, L, L)
    kpm = None
    if padded:
        kpm = torch.zeros(B, L, dtype=torch.bool)
        kpm[1, 6:] = True
        kpm[2, ::2] = True
    ref = _run("reference", q, k, v, bias, kpm)
    got = _run("chunked", q, k, v, bias, kpm, chunk_bytes=chunk_bytes)
    for name, a, b in zip(["out", "q", "k", "v", "bias"], got, ref):
        torch.testing.assert_close(a, b, **TOL, msg=name)


def test_chunked_folds_the_callers_attn_mask_into_the_bias():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 4) for _ in range(3))
    bias = torch.randn(1, 2, 5, 5)
    for mask in (torch.rand(1, 1, 5, 5) > 0.3, torch.randn(2, 1, 5, 5)):
        mask[..., 0] = True if mask.dtype == torch.bool else mask[..., 0]  # no row fully masked
        for a, b in zip(_run("chunked", q, k, v, bias, attn_mask=mask), _run("reference", q, k, v, bias, attn_mask=mask)):
            torch.testing.assert_close(a, b, **TOL)


def _attention_grads(pe, impl, x, ctx):
    torch.manual_seed(1)  # the same projection weights on every path
    attn = Attention(x.shape[-1], pe.num_heads, qkv_bias=True, pe=pe, bias_impl=impl)
    attn.zero_grad()
    xx = x.detach().clone().requires_grad_()
    out = attn(xx, ctx=ctx)
    out.square().sum().backward()
    return out, xx.grad, {n: p.grad.clone() for n, p in attn.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name,kw", [("relbias", {}), ("irpe", {"contextual": True}), ("log_cpb", {})])
def test_attention_chunked_equals_reference_with_prefix_tokens_and_padding(name, kw):
    pe, x, ctx = padded_bias_case(name, kw)
    ref = _attention_grads(pe, "reference", x, ctx)
    got = _attention_grads(pe, "chunked", x, ctx)
    torch.testing.assert_close(got[0], ref[0], **TOL)
    torch.testing.assert_close(got[1], ref[1], **TOL)
    assert got[2].keys() == ref[2].keys() and any(n.startswith("pe.") for n in ref[2])
    for n in ref[2]:
        torch.testing.assert_close(got[2][n], ref[2][n], **TOL, msg=n)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_forward_equals_reference_on_cpu_without_gradients():
    torch.manual_seed(0)
    B, H, L, d = 2, 2, 16, 8
    q, k, v = (torch.randn(B, H, L, d) for _ in range(3))
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[1, 12:] = True
    for bias in (torch.randn(1, H, L, L), torch.randn(B, H, L, L)):
        with torch.no_grad():
            ref = attend(q, k, v, bias=bias, key_padding_mask=kpm, impl="reference")
            got = attend(q, k, v, bias=bias, key_padding_mask=kpm, impl="flex")
        torch.testing.assert_close(got, ref, **TOL)
    with pytest.raises(ValueError, match="flex_attention"):
        attend(q, k, v, bias=torch.randn(1, H, L, L, requires_grad=True), impl="flex")


def test_auto_picks_the_fused_paths_and_forced_paths_refuse_what_they_cannot_do():
    q = torch.randn(1, 2, 4, 8)
    fixed, learned = torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4, requires_grad=True)
    assert pick_impl("auto", q, None) == "reference"
    assert pick_impl("auto", q, fixed) == "reference"  # no gradient: SDPA's fused kernel takes a constant mask
    assert pick_impl("auto", q, learned) == "chunked"
    assert pick_impl("auto", q, learned, dropout_p=0.1) == "reference"
    with torch.no_grad():
        assert pick_impl("auto", q, learned) == "reference"
    with pytest.raises(ValueError, match="dropout_p=0.1"):
        pick_impl("chunked", q, learned, dropout_p=0.1)
    with pytest.raises(ValueError, match="impl='fast'"):
        pick_impl("fast", q, learned)
    with pytest.raises(ValueError, match="bias='fast'"):
        set_impl(torch.nn.Linear(1, 1), bias="fast")


def _largest_allocation(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")


def test_chunked_backward_never_allocates_a_batch_of_probabilities():
    torch.manual_seed(0)
    B, H, L, d = 4, 2, 64, 8
    q, k, v = (torch.randn(B, H, L, d, requires_grad=True) for _ in range(3))
    table = torch.randn(1, H, L, L, requires_grad=True)  # 32 KiB; B x that = 128 KiB
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[0, 40:] = True
    full = B * H * L * L * 4

    def run(impl):
        return lambda: attend(q, k, v, bias=table, key_padding_mask=kpm, impl=impl, chunk_bytes=8 * 2**10).sum().backward()

    assert _largest_allocation(run("reference")) >= full  # the test can fail: the math kernel keeps them
    assert _largest_allocation(run("chunked")) <= H * L * L * 4  # the bias gradient is the largest


def test_vit_set_impl_switches_every_layer_and_keeps_results():
    torch.manual_seed(0)
    m = create_vit("vit_pico", pe="relbias", img_size=16, patch_size=4, num_classes=3)
    x = torch.randn(2, 3, 16, 16)
    out = m(x)
    out.sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    assert set_impl(m, bias="reference") == len(m.blocks)
    out2 = m(x)
    out2.sum().backward()
    torch.testing.assert_close(out2, out, **TOL)
    for n, g in grads.items():
        torch.testing.assert_close(m.get_parameter(n).grad, g, **TOL, msg=n)


@pytest.mark.parametrize("name", ["relbias", "log_cpb", "irpe", "relbias_axis"])
def test_table_lookup_equals_plain_indexing_with_its_gradient(name):
    """gather_bias (index_select, index_add_ backward) and the contiguous relbias_axis sum give
    what ``table[index]`` indexing gives, value and table gradient, on a 3x5 grid."""
    from vispe.image._bias import gather_bias
    from vispe.image.relbias import relative_position_index

    torch.manual_seed(0)
    table = torch.randn(5 * 9, 4, requires_grad=True)  # ((2h-1)(2w-1), heads)
    index = relative_position_index(3, 5)  # (15, 15)
    g = torch.randn(1, 4, 15, 15)
    got = gather_bias(table, index)
    assert got.is_contiguous() and got.shape == (1, 4, 15, 15)
    (dg,) = torch.autograd.grad(got, table, g)
    want = table[index].permute(2, 0, 1)[None]
    (dw,) = torch.autograd.grad(want, table, g)
    assert torch.equal(got, want)
    torch.testing.assert_close(dg, dw, rtol=1e-6, atol=1e-6)
    enc = build_in(name, dict(dim=32, num_heads=4, head_dim=8, grid=(3, 5), num_prefix_tokens=0))
    bias = enc((3, 5))
    assert bias.is_contiguous() and bias.shape == (1, 4, 15, 15)


@pytest.mark.parametrize("shape, chunk, want", [
    ((4, 6, 10, 10), 4 * 6 * 100 * 2, [(slice(0, 2), slice(0, 6), slice(0, 10)), (slice(2, 4), slice(0, 6), slice(0, 10))]),
    ((2, 6, 10, 10), 4 * 100 * 4, [(slice(b, b + 1), slice(h, h + 3), slice(0, 10)) for b in range(2) for h in (0, 3)]),
    ((1, 2, 10, 10), 4 * 10 * 4, [(slice(0, 1), slice(h, h + 1), slice(r, r + 4 if r < 8 else 10))
                                  for h in range(2) for r in (0, 4, 8)]),
    ((1, 1, 10, 10), 159, [(slice(0, 1), slice(0, 1), slice(r, r + 3 if r < 9 else 10)) for r in (0, 3, 6, 9)]),
])
def test_blocks_cover_every_score_once_and_prefer_whole_heads(shape, chunk, want):
    """Blocks of the chunked backward: batch items when they fit, else heads with all their rows,
    else rows of one head; together they cover (B, H, Lq) exactly once."""
    from vispe.kernels.bias_attention import _blocks

    B, H, L, _ = shape
    got = list(_blocks(B, H, L, L, chunk))
    assert got == want
    seen = torch.zeros(B, H, L, dtype=torch.int)
    for bs, hs, rs in got:
        seen[bs, hs, rs] += 1
        assert (bs.stop - bs.start) * (hs.stop - hs.start) * (rs.stop - rs.start) * L * 4 <= chunk
    assert bool((seen == 1).all())


@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
def test_chunked_bfloat16_with_padding_matches_reference(bias_dtype):
    """bfloat16 q, k, v with a key padding mask (the CPU autocast case): the chunked path runs and
    agrees with the reference path to bfloat16 precision (it once failed on the dtype of a block)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 7, 8, dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(1, 2, 7, 7, dtype=bias_dtype)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[0, 5:] = True
    ref = _run("reference", q.float(), k.float(), v.float(), bias.float(), kpm)
    got = _run("chunked", q, k, v, bias, kpm, chunk_bytes=2 * 7 * 4)
    for name, a, b in zip(["out", "q", "k", "v", "bias"], got, ref):
        assert a.dtype == (bias_dtype if name == "bias" else torch.bfloat16), name
        torch.testing.assert_close(a.float(), b, rtol=0.05, atol=0.05, msg=name)


def test_default_block_size_runs_small_problems_whole_and_bounds_large_ones(monkeypatch):
    """attend's default blocks: one when all the scores fit in CHUNK_BYTES (a ViT's 65 tokens),
    else the fewest equal blocks of at most CHUNK_BYTES; an empty batch runs (no blocks)."""
    from vispe.kernels import bias_attention as ba

    seen = []
    blocks = ba._blocks
    monkeypatch.setattr(ba, "_blocks", lambda *a: seen.append(list(blocks(*a))) or iter(seen[-1]))
    torch.manual_seed(0)
    for B, L in ((8, 128), (0, 9)):  # 1.5 MiB of scores: one block (two before)
        q, k, v = (torch.randn(B, 3, L, 8, requires_grad=True) for _ in range(3))
        bias = torch.randn(1, 3, L, L, requires_grad=True)
        attend(q, k, v, bias=bias, impl="chunked").sum().backward()
        assert len(seen[-1]) == (1 if B else 0)
        assert bias.grad.shape == bias.shape
    assert ba.default_chunk_bytes(64 * 3 * 65 * 65 * 4) == 64 * 3 * 65 * 65 * 4  # a ViT's step: one block
    assert ba.default_chunk_bytes(ba.CHUNK_BYTES + 4) == ba.CHUNK_BYTES // 2 + 2  # two equal blocks
    assert ba.default_chunk_bytes(8 * 6 * 1024 * 1024 * 4) == ba.CHUNK_BYTES  # 32x32 tokens, batch 8, 6 heads
    assert ba.default_chunk_bytes(0) == 1
    q, k, v = (torch.randn(2, 2, 16, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, 2, 16, 16, dtype=torch.float64, requires_grad=True)
    attend(q, k, v, bias=bias, impl="chunked", chunk_bytes=16 * 16 * 8).sum().backward()
    assert len(seen[-1]) == 4  # float64: one head of one item (16 x 16 x 8 bytes) per block
