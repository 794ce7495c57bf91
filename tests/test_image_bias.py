"""2D bias encodings (relbias, relbias_axis, irpe, log_cpb): translation invariance, references
(timm's index and resize, Swin-V2 coordinates), prefix rule, grid change, numerics, state_dict and
bad input (T5's buckets, Shaw's clip and iRPE's piecewise function: test_image_bias_references.py)."""
import pytest
import torch
from timm.layers.pos_embed_rel import (
    gen_relative_log_coords,
    gen_relative_position_index,
    resize_rel_pos_bias_table_simple,
)

import vispe
from vispe.encoding import GRID_KEY
from vispe.image.relbias import relative_position_index

HEADS, HEAD_DIM = 2, 8

# every non-contextual variant, built for a 3x5 window where a grid is needed
VARIANTS = {
    "relbias": ("relbias", dict(grid=(3, 5))),
    "relbias_axis_shaw": ("relbias_axis", dict(index="shaw", max_distance=3)),
    "relbias_axis_t5": ("relbias_axis", dict(index="t5", num_buckets=8, max_distance=6)),
    "irpe_euclidean": ("irpe", dict(method="euclidean")),
    "irpe_quant": ("irpe", dict(method="quant")),
    "irpe_cross": ("irpe", dict(method="cross")),
    "irpe_product": ("irpe", dict(method="product")),
    "log_cpb": ("log_cpb", dict(hidden_dim=32)),
}


def build(key, randomize=True, **kw):
    name, base = VARIANTS[key] if key in VARIANTS else (key, {})
    enc = vispe.build(name, num_heads=HEADS, **{**base, **kw})
    if randomize:  # random parameters, so that no property holds by zero initialisation
        torch.manual_seed(0)
        with torch.no_grad():
            for p in enc.parameters():
                p.normal_()
    return enc


def build_any(key, **kw):
    """A variant of VARIANTS, or "irpe_ctx": contextual iRPE."""
    if key == "irpe_ctx":
        return build("irpe", contextual=True, head_dim=HEAD_DIM, **kw)
    return build(key, **kw)


def read_table(table, index):
    """Reference lookup: (L, heads) table read at an (N, N) index.  # (heads, N, N)"""
    return table[index.reshape(-1)].reshape(*index.shape, table.shape[-1]).permute(2, 0, 1)


def offsets(h, w):
    c = torch.tensor([divmod(i, w) for i in range(h * w)])  # (N, 2) as (y, x)
    return c[:, None, :] - c[None, :, :]  # (N, N, 2) query minus key


@pytest.mark.parametrize("key", VARIANTS)
@pytest.mark.parametrize("shape", [(3, 5), (4, 4)])
def test_translation_invariant(key, shape):
    h, w = shape
    bias = build(key)(shape)[0]  # (heads, N, N)
    assert bias.shape == (HEADS, h * w, h * w)
    d = offsets(h, w)
    groups = (d[..., 0] + h) * (2 * w + 1) + (d[..., 1] + w)  # one id per 2D offset
    spread = []
    for g in groups.unique():
        vals = bias[:, groups == g]  # (heads, pairs with this offset)
        assert (vals.amax(-1) - vals.amin(-1)).abs().max() <= 1e-6, f"offset group {int(g)} not constant"
        spread.append(vals[:, 0])
    assert torch.stack(spread, -1).std(-1).min() > 1e-3  # different offsets give different biases


@pytest.mark.parametrize("window", [(3, 5), (4, 4), (7, 7), (1, 1), (5, 2)])
def test_joint_index_equals_timm(window):
    assert torch.equal(relative_position_index(*window), gen_relative_position_index(window))


def test_relbias_with_one_prefix_token_equals_beit_table():
    h, w = 3, 5
    enc = build("relbias", num_prefix_tokens=1)
    L = (2 * h - 1) * (2 * w - 1)
    ext = torch.randn(L + 3, HEADS)  # BEiT/timm: table + cls->token, token->cls, cls->cls
    with torch.no_grad():
        enc.table.copy_(ext[:L])
        enc.prefix_to_token.copy_(ext[L][:, None])
        enc.token_to_prefix.copy_(ext[L + 1][:, None])
        enc.prefix_to_prefix.copy_(ext[L + 2][:, None, None])
    index = gen_relative_position_index((h, w), class_token=True)  # (1+N, 1+N)
    want = read_table(ext, index)
    torch.testing.assert_close(enc((h, w))[0], want)


@pytest.mark.parametrize("key", VARIANTS)
def test_prefix_rows_and_columns_are_learned(key):
    P, (h, w) = 2, (3, 5)
    enc = build(key, num_prefix_tokens=P)
    bias = enc((h, w))
    N = h * w
    assert bias.shape == (1, HEADS, P + N, P + N)
    names = {n for n, _ in enc.named_parameters()}
    assert {"prefix_to_token", "token_to_prefix", "prefix_to_prefix"} <= names
    torch.testing.assert_close(bias[0, :, :P, :P], enc.prefix_to_prefix)
    torch.testing.assert_close(bias[0, :, :P, P:], enc.prefix_to_token[:, :, None].expand(-1, -1, N))
    torch.testing.assert_close(bias[0, :, P:, :P], enc.token_to_prefix[:, None, :].expand(-1, N, -1))
    grid_only = build(key, randomize=False)
    grid_only.load_state_dict({n: v for n, v in enc.state_dict().items() if "prefix" not in n})
    torch.testing.assert_close(bias[:, :, P:, P:], grid_only((h, w)))  # grid block unchanged
    bias.sum().backward()
    for n in ("prefix_to_token", "token_to_prefix", "prefix_to_prefix"):
        assert getattr(enc, n).grad is not None and getattr(enc, n).grad.abs().sum() > 0
    assert torch.equal(vispe.build(VARIANTS[key][0], num_heads=HEADS, num_prefix_tokens=P,
                                   **VARIANTS[key][1]).prefix_to_token, torch.zeros(HEADS, P))


def test_relbias_same_grid_is_identity_and_bigger_grid_resizes():
    enc = build("relbias")
    table = enc.table.detach().clone()
    bias = enc((3, 5))[0]
    torch.testing.assert_close(bias, read_table(table, relative_position_index(3, 5)))
    enc.resize_((3, 5))
    assert torch.equal(enc.table, table)
    big = enc((5, 7))  # run time: resized, stored table unchanged
    assert big.shape == (1, HEADS, 35, 35) and torch.isfinite(big).all()
    assert enc.table.shape == (5 * 9, HEADS) and enc.grid == (3, 5)
    enc.resize_((5, 7))  # load time: for good
    assert enc.table.shape == (9 * 13, HEADS) and enc.grid == (5, 7)
    torch.testing.assert_close(enc((5, 7)), big)


def test_relbias_resize_matches_timm_bicubic():
    enc = build("relbias", grid=(4, 4))
    got = enc.table_for((6, 6))
    want = resize_rel_pos_bias_table_simple(enc.table.detach(), (6, 6), (11 * 11, HEADS))
    torch.testing.assert_close(got, want)
    # the resized bias is the resized table read with the new window's index
    bias = enc((6, 6))[0]
    torch.testing.assert_close(bias, read_table(want, gen_relative_position_index((6, 6))))


def test_relbias_resize_gradient_reaches_table():
    enc = build("relbias", resize_mode="bilinear")
    enc((2, 3)).sum().backward()  # shrinking: antialiased
    assert enc.table.grad is not None and enc.table.grad.abs().sum() > 0


@pytest.mark.parametrize("key", [k for k in VARIANTS if k != "relbias"] + ["log_cpb_pretrained"])
def test_recomputed_at_a_new_grid(key):
    kw = dict(pretrained_window=(4, 4)) if key == "log_cpb_pretrained" else {}
    enc = build("log_cpb" if key == "log_cpb_pretrained" else key, **kw)
    small, big = enc((3, 5))[0], enc((6, 8))[0]
    ys, xs = torch.meshgrid(torch.arange(3), torch.arange(5), indexing="ij")
    sub = (ys * 8 + xs).reshape(-1)  # the 3x5 window's tokens in the 6x8 grid
    block = big[:, sub][:, :, sub]
    if key == "log_cpb":  # Swin-V2 normalises by the current window: the bias changes with the grid
        assert not torch.allclose(block, small)
    else:  # offsets are what counts: the same window inside a larger grid has the same bias
        torch.testing.assert_close(block, small)


def test_log_cpb_reference():
    enc = build("log_cpb", hidden_dim=16)
    for window, pretrained in [((3, 5), None), ((6, 6), (4, 4)), ((1, 1), None)]:
        h, w = window
        if h > 1:  # timm divides 0 by 0 for a length-1 window
            coords = gen_relative_log_coords(window, pretrained or (0, 0), mode="swin")
        else:
            coords = torch.zeros(1, 1, 2)
        enc.pretrained_window = pretrained
        enc._cache.clear()
        with torch.no_grad():
            table = 16 * torch.sigmoid(enc.mlp(coords)).reshape(-1, HEADS)
        want = read_table(table, gen_relative_position_index(window))
        torch.testing.assert_close(enc(window)[0], want)


def test_log_cpb_large_table_keeps_no_hidden_layer_for_the_backward(monkeypatch):
    """With gradients, a table of more offsets than cpb.CHECKPOINT_ROWS is computed in checkpointed
    chunks: the same values and gradients, and no (offsets, hidden) activation saved for the backward."""
    from vispe.image import cpb

    torch.manual_seed(0)
    enc = build("log_cpb", hidden_dim=16)

    def run(rows):
        monkeypatch.setattr(cpb, "CHECKPOINT_ROWS", rows)
        enc.zero_grad()
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
            table = enc.relative_table((4, 5), "cpu")  # (7 * 9, heads)
        table.square().sum().backward()
        return table, [p.grad.clone() for p in enc.parameters()], shapes

    want, grads, saved = run(10**9)
    got, got_grads, got_saved = run(7)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for a, b in zip(got_grads, grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert (63, 16) in saved  # the test can fail: unchunked, the (offsets, hidden) layer is saved
    with torch.no_grad():  # inference: chunk by chunk too, the same values
        torch.testing.assert_close(enc.relative_table((4, 5), "cpu"), want.detach(), rtol=0, atol=0)
    assert not any(len(s) == 2 and s[1] == 16 and s[0] >= 7 for s in got_saved), got_saved  # no chunk of it either


@pytest.mark.parametrize("key", list(VARIANTS) + ["irpe_ctx"])
def test_float32_math_under_bf16_autocast(key):
    ctx = key == "irpe_ctx"
    enc = build_any(key, num_prefix_tokens=1)
    shape = (4, 6)
    q = torch.randn(2, HEADS, 1 + 24, HEAD_DIM).bfloat16() if ctx else None
    ref = enc(shape, q=q)  # float32
    assert ref.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = enc(shape, dtype=torch.bfloat16, q=q)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, ref.to(torch.bfloat16))  # computed in float32, cast at the end


@pytest.mark.parametrize("key", list(VARIANTS) + ["irpe_ctx"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (32, 32)])
def test_forward_backward_finite(key, shape):
    ctx = key == "irpe_ctx"
    enc = build_any(key, num_prefix_tokens=1)
    L = 1 + shape[0] * shape[1]
    q = torch.randn(1, HEADS, L, HEAD_DIM, requires_grad=True) if ctx else None
    bias = enc(shape, q=q)
    assert bias.shape == (1, HEADS, L, L) and torch.isfinite(bias).all()
    bias.square().sum().backward()
    for n, p in enc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


@pytest.mark.parametrize("key", VARIANTS)
def test_state_dict_only_parameters_and_round_trip(key):
    enc = build(key, num_prefix_tokens=1)
    enc((3, 5))  # fill the caches
    sd = enc.state_dict()
    record = {GRID_KEY} if key == "relbias" else set()  # the grid of its table (issue 19)
    assert set(sd) == {n for n, _ in enc.named_parameters()} | record
    other = build(key, randomize=False, num_prefix_tokens=1)
    other.load_state_dict(sd)
    torch.testing.assert_close(other((4, 6)), enc((4, 6)))


@pytest.mark.parametrize("name", ["relbias", "relbias_axis", "irpe", "log_cpb"])
def test_uniform_build_kwargs(name):
    enc = vispe.build(name, dim=HEADS * HEAD_DIM, num_heads=HEADS, head_dim=HEAD_DIM, grid=(3, 5),
                      num_prefix_tokens=1)
    assert enc.family == "bias" and not enc.mask_aware
    mask = torch.zeros(2, 3, 5, dtype=torch.bool)
    mask[0, :, 4] = True
    torch.testing.assert_close(enc((3, 5), mask), enc((3, 5)))  # not mask-aware, documented


@pytest.mark.parametrize("name", ["relbias", "relbias_axis", "irpe", "log_cpb"])
@pytest.mark.parametrize("kw, arg", [
    (dict(num_heads=0), "num_heads"),
    (dict(dim=17, head_dim=HEAD_DIM), "dim"),
    (dict(dim=15), "dim"),
    (dict(num_prefix_tokens=-1), "num_prefix_tokens"),
    (dict(grid=(0, 2)), "grid"),
])
def test_bad_common_arguments(name, kw, arg):
    base = dict(num_heads=HEADS, grid=(3, 5))
    with pytest.raises(ValueError, match=arg):
        vispe.build(name, **{**base, **kw})


@pytest.mark.parametrize("name, kw, arg", [
    ("relbias", dict(), "grid"),
    ("relbias", dict(grid=(3, 5), resize_mode="nearest"), "resize_mode"),
    ("relbias_axis", dict(index="rope"), "index"),
    ("relbias_axis", dict(index="shaw", num_buckets=8), "num_buckets"),
    ("relbias_axis", dict(index="t5", num_buckets=16, max_distance=4), "max_distance"),
    ("relbias_axis", dict(max_distance=0), "max_distance"),
    ("irpe", dict(method="manhattan"), "method"),
    ("irpe", dict(alpha=5.0, beta=3.0), "alpha"),
    ("irpe", dict(gamma=1.0), "gamma"),
    ("irpe", dict(contextual="yes", head_dim=HEAD_DIM), "contextual"),
    ("log_cpb", dict(hidden_dim=0), "hidden_dim"),
    ("log_cpb", dict(pretrained_window=(8, 0)), "pretrained_window"),
])
def test_bad_specific_arguments(name, kw, arg):
    with pytest.raises(ValueError, match=arg):
        vispe.build(name, num_heads=HEADS, **kw)


@pytest.mark.parametrize("key", ["relbias", "irpe_product"])
def test_bad_forward_input(key):
    enc = build(key)
    with pytest.raises(ValueError, match="shape"):
        enc((3, 0))
    with pytest.raises(ValueError, match="mask"):
        enc((3, 5), torch.zeros(1, 5, 3, dtype=torch.bool))
