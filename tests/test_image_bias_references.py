"""2D bias encodings against their papers' definitions, offset by offset on a non-square grid:
relbias_axis's Shaw clip and T5 buckets, iRPE's piecewise index (Eq. 18), its four methods and the
contextual form (the shared properties of every bias encoding: test_image_bias.py)."""
import math

import pytest
import torch
from test_image_bias import HEAD_DIM, HEADS, build

import vispe
from vispe.image.irpe import piecewise_index


def t5_reference(d, num_buckets, max_distance):
    """T5's bidirectional bucket of a key-minus-query offset d, in plain Python (Raffel et al.)."""
    n = num_buckets // 2
    out = n if d > 0 else 0
    d = abs(d)
    exact = n // 2
    if d < exact:
        return out + d
    return out + min(n - 1, exact + int(math.log(d / exact) / math.log(max_distance / exact) * (n - exact)))


@pytest.mark.parametrize("key", ["relbias_axis_shaw", "relbias_axis_t5"])
def test_relbias_axis_reference(key):
    h, w = 4, 9  # offsets up to 8: past shaw's clip (3) and t5's exact range
    enc = build(key)
    bias = enc((h, w))[0]  # (heads, N, N)
    if key.endswith("shaw"):
        idx = lambda d: max(-3, min(3, d)) + 3  # noqa: E731
    else:
        idx = lambda d: t5_reference(d, 8, 6)  # noqa: E731
    for i in range(h * w):
        for j in range(h * w):
            (yi, xi), (yj, xj) = divmod(i, w), divmod(j, w)
            want = enc.table_y[idx(yj - yi)] + enc.table_x[idx(xj - xi)]  # key minus query
            torch.testing.assert_close(bias[:, i, j], want)


def g_reference(x, alpha, beta, gamma):
    """iRPE Eq. 18 for one number, in plain Python."""
    if abs(x) <= alpha:
        return round(x)
    v = min(beta, round(alpha + math.log(abs(x) / alpha) / math.log(gamma / alpha) * (beta - alpha)))
    return int(math.copysign(1, x) * v)


@pytest.mark.parametrize("abg", [(1.9, 3.8, 15.2), (3.0, 6.0, 20.0), (1.0, 4.5, 10.0)])
def test_irpe_piecewise_index_reference(abg):
    x = torch.arange(-40, 41)
    got = piecewise_index(x, *abg)
    want = torch.tensor([g_reference(float(v), *abg) for v in x])
    assert torch.equal(got, want)
    assert got.abs().max() == int(abg[1])  # clipped at beta


def buckets(method, dy, dx, abg=(1.9, 3.8, 15.2)):
    """[(table name, bucket)] of a query-minus-key offset, from the paper's definitions."""
    g = lambda v: g_reference(v, *abg)  # noqa: E731
    B = int(abg[1])
    if method == "euclidean":
        return [("table", g(round(math.sqrt(dy * dy + dx * dx))))]
    if method == "quant":
        return [("table", g(dy * dy + dx * dx))]
    if method == "cross":
        return [("table_y", g(dy) + B), ("table_x", g(dx) + B)]
    return [("table", (g(dy) + B) * (2 * B + 1) + g(dx) + B)]


@pytest.mark.parametrize("method", ["euclidean", "quant", "cross", "product"])
def test_irpe_bias_reference(method):
    h, w = 3, 5
    enc = build("irpe", method=method)
    bias = enc((h, w))[0]  # (heads, N, N)
    for i in range(h * w):
        for j in range(h * w):
            (yi, xi), (yj, xj) = divmod(i, w), divmod(j, w)
            want = sum(getattr(enc, n)[:, k] for n, k in buckets(method, yi - yj, xi - xj))
            torch.testing.assert_close(bias[:, i, j], want)


@pytest.mark.parametrize("method", ["euclidean", "quant", "cross", "product"])
def test_irpe_contextual(method):
    h, w, P, B = 3, 5, 1, 2
    enc = build("irpe", method=method, contextual=True, head_dim=HEAD_DIM, num_prefix_tokens=P)
    assert enc.contextual
    q = torch.randn(B, HEADS, P + h * w, HEAD_DIM, requires_grad=True)
    bias = enc((h, w), q=q)
    assert bias.shape == (B, HEADS, P + h * w, P + h * w)
    # reference: bias_ij = (q_i / sqrt(d)) . r[bucket(i, j)], summed over the method's tables
    qs = q.detach()[:, :, P:] / math.sqrt(HEAD_DIM)  # (B, heads, N, d)
    for bi, hi, i, j in [(0, 0, 0, 0), (1, 1, 3, 12), (0, 1, 14, 2), (1, 0, 7, 8), (0, 0, 10, 4)]:
        (yi, xi), (yj, xj) = divmod(i, w), divmod(j, w)
        want = sum(qs[bi, hi, i] @ getattr(enc, n)[hi, k] for n, k in buckets(method, yi - yj, xi - xj))
        torch.testing.assert_close(bias[bi, hi, P + i, P + j], want)
    # depends on the queries: changing query 4 of image 0 changes only row 4 of image 0
    q2 = q.detach().clone()
    q2[0, :, P + 4] += 1
    diff = (enc((h, w), q=q2) - bias).abs().sum(1)  # (B, L, L)
    assert diff[0, P + 4, P:].sum() > 0 and diff[0].sum() == diff[0, P + 4].sum() and diff[1].sum() == 0
    bias.square().sum().backward()
    assert torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0
    for n, t in enc.named_parameters():
        if n.startswith("table"):
            assert t.grad is not None and t.grad.abs().sum() > 0, n


def test_irpe_contextual_needs_q_and_head_dim():
    with pytest.raises(ValueError, match="head_dim"):
        vispe.build("irpe", num_heads=HEADS, contextual=True)
    enc = vispe.build("irpe", num_heads=HEADS, contextual=True, dim=HEADS * HEAD_DIM)
    assert enc.head_dim == HEAD_DIM
    with pytest.raises(ValueError, match="q"):
        enc((3, 5))
    with pytest.raises(ValueError, match="q has shape"):
        enc((3, 5), q=torch.randn(1, HEADS, 14, HEAD_DIM))
