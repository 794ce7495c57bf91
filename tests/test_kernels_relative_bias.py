"""vispe.kernels.relative_bias: attention with a relative bias kept as its table, against SDPA with
the dense bias (values and gradients), for every relative encoding, and its memory promise."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from conftest import padded_bias_case
from vispe.attention import Attention
from vispe.image._bias import gather_bias
from vispe.image.relbias import relative_position_index
from vispe.kernels._relative_blocks import _row_blocks
from vispe.kernels.bias_attention import attend
from vispe.kernels.relative_bias import RelativeBias, attend_relative, relative_attention
from vispe.registry import available, build_in

TOL = dict(rtol=1e-5, atol=1e-5)
RELATIVE = [("relbias", {}), ("log_cpb", {}), ("irpe", {}), ("irpe", {"method": "cross"}),
            ("irpe", {"method": "euclidean"}), ("relbias_axis", {}), ("relbias_axis", {"index": "t5", "num_buckets": 6,
                                                                                       "max_distance": 3}),
            ("lookhere", {}), ("lookhere", {"variant": "lh45", "fill_with": "max", "distance": "sqrt"})]


def dense(table, shape, prefix):
    """The bias a RelativeBias stands for, written out: timm's ``table[index]`` and BEiT's prefix rows.  # (1, H, L, L)"""
    h, w = shape
    H, N = table.shape[1], h * w
    grid = table[relative_position_index(h, w)].permute(2, 0, 1)[None]  # (1, H, N, N)
    if prefix is None:
        return grid
    p2p, p2t, t2p = prefix
    P = p2p.shape[-1]
    top = torch.cat([p2p[None], p2t[None, :, :, None].expand(1, H, P, N)], -1)
    return torch.cat([top, torch.cat([t2p[None, :, None, :].expand(1, H, N, P), grid], -1)], -2)


def _grads(fn, leaves, g):
    out = fn()
    return [out, *torch.autograd.grad(out, leaves, g)]


def _relative_case(shape, P, padded, dtype, B=3, H=2, d=8):
    """q, k, v, table, prefix scalars (dtype, leaves), a key padding mask and an output gradient."""
    h, w = shape
    L = P + h * w
    leaf = dict(dtype=dtype, requires_grad=True)
    q, k, v = (torch.randn(B, H, L, d, **leaf) for _ in range(3))
    table = torch.randn((2 * h - 1) * (2 * w - 1), H, **leaf)
    prefix = tuple(torch.randn(*s, **leaf) for s in ((H, P, P), (H, P), (H, P))) if P else None
    kpm = None
    if padded:
        kpm = torch.zeros(B, L, dtype=torch.bool)
        kpm[1 % B, -2:] = True
        kpm[2 % B, P::2] = True
    return q, k, v, table, prefix, kpm, torch.randn(B, H, L, d, dtype=dtype)


def _relative_against_dense(shape, P, padded, chunk_bytes, dtype, tol, **kw):
    """The relative kernel in ``dtype`` against SDPA with the dense bias in float64 on the same numbers."""
    q, k, v, table, prefix, kpm, g = _relative_case(shape, P, padded, dtype, **kw)
    leaves = [q, k, v, table, *(prefix or ())]
    rel = RelativeBias(table, shape, prefix, dense=None)
    got = _grads(lambda: relative_attention(q, k, v, rel, kpm, chunk_bytes), leaves, g)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    qw, kw_, vw, tw, *pw = wide
    want = _grads(lambda: attend(qw, kw_, vw, bias=dense(tw, shape, tuple(pw) if P else None), key_padding_mask=kpm,
                                 impl="reference"), wide, g.double())
    for name, a, b in zip(["out", "q", "k", "v", "table", "p2p", "p2t", "t2p"], got, want):
        assert a.dtype == dtype, name
        torch.testing.assert_close(a.double(), b, **tol, msg=name)


@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (1, 4)])
@pytest.mark.parametrize("P", [0, 2])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("chunk_bytes", [2**30, 1])  # one block; one grid row of one head of one item per block
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_relative_attention_equals_sdpa_with_the_dense_bias(shape, P, padded, chunk_bytes, dtype):
    """Output and the gradients of q, k, v, the table and the prefix scalars, non-square grids, prefix
    tokens, a padded batch, one block or the smallest blocks; float64 (to 1e-10) and float32, the
    branch training takes (SDPA's log-sum-exp kept for the backward), against float64."""
    torch.manual_seed(0)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-4, atol=2e-5)
    _relative_against_dense(shape, P, padded, chunk_bytes, dtype, tol)


@pytest.mark.parametrize("P", [0, 1])
def test_float32_backward_from_512_keys_equals_the_dense_bias(P):
    """From 512 keys on, float32's backward takes its own products (oneDNN's linear where torch has it,
    ``vispe.kernels.relative_bias``): a 16 x 33 grid, padded, with and without a prefix token."""
    torch.manual_seed(0)
    _relative_against_dense((16, 33), P, True, 2**22, torch.float32, dict(rtol=1e-4, atol=2e-5), B=2, H=2, d=8)


@pytest.mark.parametrize("name,kw", RELATIVE)
def test_every_relative_encoding_gives_its_own_bias_as_a_table(name, kw):
    """``relative(shape)`` read at the grid's relative index is the encoding's forward, bit for bit,
    on non-square grids, with the prefix scalars; contextual iRPE has no table."""
    torch.manual_seed(0)
    enc = build_in(name, dict(dim=16, num_heads=2, head_dim=8, grid=(4, 3), num_prefix_tokens=1), **kw)
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(torch.randn_like(p))
    for shape in [(3, 5), (5, 3), (4, 3)]:
        table, prefix = enc.relative(shape)
        assert table.dtype == torch.float32 and table.shape == ((2 * shape[0] - 1) * (2 * shape[1] - 1), 2)
        assert torch.equal(dense(table, shape, prefix), enc(shape)), shape
        assert torch.equal(gather_bias(table, relative_position_index(*shape)), enc.grid_bias(shape, "cpu", None))
    assert build_in("irpe", dict(dim=16, num_heads=2, grid=(3, 3)), contextual=True).relative((3, 3)) is None
    assert build_in("lookhere", dict(num_heads=4), directions="center").relative((3, 3)) is None  # distance to the centre
    contextual = {"relpos_decomposed"}  # biases of the queries (SAM's decomposed tables): no table of offsets
    for n in contextual:
        assert build_in(n, dict(dim=16, num_heads=2, head_dim=8, grid=(3, 3))).relative((3, 3)) is None
    assert {n for n, _ in RELATIVE} | contextual == set(available("bias"))  # a new bias: decide which it is


def _attention(pe, impl, x, ctx, grad=True):
    torch.manual_seed(1)  # the same projection weights on every path
    attn = Attention(x.shape[-1], pe.num_heads, qkv_bias=True, pe=pe, bias_impl=impl)
    pe.zero_grad()
    xx = x.detach().clone().requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out = attn(xx, ctx=ctx)
    if not grad:
        return [out]
    out.square().sum().backward()
    return [out, xx.grad] + [p.grad.clone() for p in attn.parameters()]


@pytest.mark.parametrize("name,kw", RELATIVE)
def test_attention_auto_equals_reference_for_every_relative_encoding(name, kw):
    """The default path (the relative kernel) against the dense bias in SDPA: output, input and every
    parameter's gradient (prefix scalars included), with a padding mask; and without gradients."""
    pe, x, ctx = padded_bias_case(name, kw)
    want = _attention(pe, "reference", x, ctx)
    for impl in ("auto", "chunked"):  # this small grid: the dense bias; the relative kernel
        got = _attention(pe, impl, x, ctx)
        assert len(got) == len(want) > 4
        for i, (a, b) in enumerate(zip(got, want)):
            torch.testing.assert_close(a, b, **TOL, msg=f"{impl} {i}")
        torch.testing.assert_close(_attention(pe, impl, x, ctx, grad=False)[0], want[0], **TOL)


def test_bfloat16_inputs_match_the_reference_to_bfloat16_precision():
    """bfloat16 q, k, v (CPU autocast) with a float32 table and a padding mask: runs, close to float32."""
    torch.manual_seed(0)
    h, w, P, H = 3, 4, 1, 2
    q, k, v = (torch.randn(2, H, P + h * w, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    table = torch.randn((2 * h - 1) * (2 * w - 1), H, requires_grad=True)
    prefix = tuple(torch.randn(*s, requires_grad=True) for s in ((H, P, P), (H, P), (H, P)))
    kpm = torch.zeros(2, P + h * w, dtype=torch.bool)
    kpm[0, -3:] = True
    leaves = [q, k, v, table, *prefix]
    g = torch.randn(2, H, P + h * w, 8)
    got = _grads(lambda: relative_attention(q, k, v, RelativeBias(table, (h, w), prefix, None), kpm, 1), leaves, g.bfloat16())
    f32 = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = _grads(lambda: attend(*f32, bias=dense(table, (h, w), prefix), key_padding_mask=kpm, impl="reference"),
                  f32 + leaves[3:], g)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == (torch.bfloat16 if i < 4 else torch.float32)
        torch.testing.assert_close(a.float(), b, rtol=0.05, atol=0.05, msg=str(i))


def test_other_paths_take_the_dense_bias(monkeypatch):
    """"reference", a caller's attn_mask or dropout, and "auto" below DENSE_BYTES: ``attend`` with
    ``dense()``; "chunked" refuses dropout by name."""
    from vispe.kernels import relative_bias as rb

    torch.manual_seed(0)
    q = torch.randn(1, 2, 5, 4)
    table = torch.randn(3 * 3, 2)
    calls = []
    rel = RelativeBias(table, (2, 2), (torch.zeros(2, 1, 1), torch.zeros(2, 1), torch.zeros(2, 1)),
                       dense=lambda: calls.append(1) or dense(table, (2, 2), rel.prefix))
    want = attend(q, q, q, bias=dense(table, (2, 2), rel.prefix), impl="reference")
    torch.testing.assert_close(attend_relative(q, q, q, rel), want, **TOL)
    assert len(calls) == 1  # a small problem: the dense bias
    monkeypatch.setattr(rb, "DENSE_BYTES", 0)
    torch.testing.assert_close(attend_relative(q, q, q, rel), want, **TOL)
    assert len(calls) == 1  # the relative kernel: no dense bias
    torch.testing.assert_close(attend_relative(q, q, q, rel, impl="reference"), want, **TOL)
    mask = torch.ones(1, 1, 5, 5, dtype=torch.bool)
    torch.testing.assert_close(attend_relative(q, q, q, rel, attn_mask=mask), want, **TOL)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="dropout_p=0.1"):
        attend_relative(q, q, q, rel, impl="chunked", dropout_p=0.1)
    with pytest.raises(ValueError, match=r"table has shape \(9, 2\)"):
        RelativeBias(table, (3, 2), None, None)


def _largest_allocation(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")


def test_the_dense_bias_is_never_built_forward_or_backward():
    """32x32 tokens, 2 heads: the dense bias (2 x 1025^2 float32, 8 MiB) is the dense path's largest
    allocation; the relative kernel's largest is one block of scores (here 1 MiB)."""
    torch.manual_seed(0)
    h = w = 32
    H, L = 2, 1 + h * w
    q, k, v = (torch.randn(1, H, L, 16, requires_grad=True) for _ in range(3))
    table = torch.randn((2 * h - 1) * (2 * w - 1), H, requires_grad=True)
    prefix = tuple(torch.zeros(*s, requires_grad=True) for s in ((H, 1, 1), (H, 1), (H, 1)))
    full = H * L * L * 4
    rel = RelativeBias(table, (h, w), prefix, dense=None)
    chunk = 2**20
    run_dense = lambda: attend(q, k, v, bias=dense(table, (h, w), prefix), impl="chunked",  # noqa: E731
                               chunk_bytes=chunk).sum().backward()
    assert _largest_allocation(run_dense) >= full  # the test can fail: the dense path holds the whole bias
    assert _largest_allocation(lambda: relative_attention(q, k, v, rel, None, chunk).sum().backward()) <= chunk
    with torch.no_grad():
        assert _largest_allocation(lambda: relative_attention(q, k, v, rel, None, chunk)) <= chunk


@pytest.mark.parametrize("B,H,h,w,chunk", [(3, 2, 4, 5, 10**9), (3, 2, 4, 5, 1), (4, 3, 6, 2, 2 * 2 * 13 * 4 * 4),
                                           (2, 3, 1, 7, 7 * 7 * 4 * 2)])
def test_row_blocks_cover_every_query_row_once(B, H, h, w, chunk):
    L = h * w
    for batched in (True, False):
        seen = torch.zeros(B, H, h, dtype=torch.int)
        for bs, hs, ys in _row_blocks(B, H, h, w, L, chunk, batched):
            seen[bs, hs, ys] += 1
            nb = (bs.stop - bs.start) if batched else 1
            rows = (hs.stop - hs.start) * (ys.stop - ys.start) * w
            assert nb * rows * L * 4 <= max(chunk, w * L * 4)  # at least one grid row of one item
        assert bool((seen == 1).all())


def test_the_kernel_as_custom_operators_for_torch_compile(monkeypatch):
    """opcheck (fake kernels against real ones, schema, autograd registration) on a non-square grid with
    prefix tokens and padding; a graph recorded by torch.compile calls the operator (no dense bias, no
    graph break) and gives eager's output and gradients."""
    from vispe.kernels import relative_bias as rb

    monkeypatch.setattr(rb, "DENSE_BYTES", 0)  # the operator also for this small problem
    torch.manual_seed(0)
    (h, w), B, H, P, d = (2, 3), 2, 2, 1, 4
    L = P + h * w
    q, k, v = (torch.randn(B, H, L, d, requires_grad=True) for _ in range(3))
    table = torch.randn(3 * 5, H, requires_grad=True)
    prefix = [torch.randn(*s, requires_grad=True) for s in ((H, P, P), (H, P), (H, P))]
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[1, -1] = True
    torch.library.opcheck(rb._op_forward, (q, k, v, table, *prefix, kpm, h, w, 2**20))
    grid = [t[:, :, P:].detach().clone().requires_grad_() for t in (q, k, v)]  # no prefix tokens
    torch.library.opcheck(rb._op_forward, (*grid, table, None, None, None, None, h, w, 2**20))
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return gm

    torch._dynamo.reset()
    fn = torch.compile(lambda *a: attend_relative(*a[:3], RelativeBias(a[3], (h, w), tuple(a[4:7]), dense=None),
                                                  key_padding_mask=kpm), backend=backend, fullgraph=True)
    leaves = [q, k, v, table, *prefix]
    g = torch.randn(B, H, L, d)
    got = _grads(lambda: fn(*leaves), leaves, g)
    want = _grads(lambda: relative_attention(q, k, v, RelativeBias(table, (h, w), tuple(prefix), None), kpm), leaves, g)
    assert any("relative_bias_attention" in s for s in seen), seen
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, **TOL, msg=str(i))


@pytest.mark.parametrize("onednn", [True, False])
def test_float32_backward_through_onednn_and_through_bmm(onednn, monkeypatch):
    """float32 on the CPU: the backward's products through oneDNN's linear (where torch has it) or torch's
    bmm, both against the dense bias in SDPA, batch of 3 (summed into the table), prefix and padding."""
    from vispe.kernels import _relative_blocks

    if onednn and not _relative_blocks.onednn_linear():
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setattr(_relative_blocks, "onednn_linear", lambda: onednn)
    torch.manual_seed(0)
    (h, w), B, H, P, d = (3, 200), 3, 2, 1, 8  # 601 keys: oneDNN's products from 512 keys on
    L = P + h * w
    q, k, v = (torch.randn(B, H, L, d, requires_grad=True) for _ in range(3))
    table = torch.randn((2 * h - 1) * (2 * w - 1), H, requires_grad=True)
    prefix = tuple(torch.randn(*s, requires_grad=True) for s in ((H, P, P), (H, P), (H, P)))
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[2, -3:] = True
    leaves, g = [q, k, v, table, *prefix], torch.randn(B, H, L, d)
    got = _grads(lambda: relative_attention(q, k, v, RelativeBias(table, (h, w), prefix, None), kpm, 2 * w * L * 4), leaves, g)
    want = _grads(lambda: attend(q, k, v, bias=dense(table, (h, w), prefix), key_padding_mask=kpm, impl="reference"),
                  leaves, g)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, **TOL, msg=str(i))
