"""2D rotary encodings (rope_axial, rope_mixed): references on a non-square grid, the relative
property, (y, x) channel order, layouts, masks, numerics, state_dict and bad input."""
import pytest
import torch

import vispe
from vispe.axis.rope import apply_rope, half_to_interleaved

NAMES = ["rope_axial", "rope_mixed"]
H, W = 3, 5  # non-square on purpose: a y/x swap cannot cancel
HEAD_DIM, HEADS = 16, 2


def build(name, **kw):
    base = dict(head_dim=HEAD_DIM, num_heads=HEADS)
    return vispe.build(name, **{**base, **kw}).eval()


def yx(i, w=W):
    return divmod(i, w)


def ref_axial(h, w, head_dim, base, coord=lambda i, n: i, scale=1.0):
    """Independent float64 reference: y on the first head_dim/4 pairs, then x."""
    q = head_dim // 4
    out = torch.zeros(h * w, head_dim // 2, dtype=torch.float64)
    for i in range(h * w):
        y, x = divmod(i, w)
        for k in range(q):
            f = base ** (-4.0 * k / head_dim)
            out[i, k] = coord(y, h) * scale * f
            out[i, q + k] = coord(x, w) * scale * f
    return out


def test_axial_matches_reference_non_square():
    enc = build("rope_axial", base=100.0)
    a = enc((H, W))
    assert a.shape == (1, 1, H * W, HEAD_DIM // 2) and a.dtype == torch.float32
    torch.testing.assert_close(a[0, 0].double(), ref_axial(H, W, HEAD_DIM, 100.0), rtol=1e-6, atol=1e-6)


def test_axial_centered_coords_with_scale():
    enc = build("rope_axial", coords="centered", scale=7.0, base=50.0)
    centred = lambda i, n: (i + 0.5) / n * 2 - 1  # noqa: E731
    want = ref_axial(H, W, HEAD_DIM, 50.0, centred, scale=7.0)
    torch.testing.assert_close(enc((H, W))[0, 0].double(), want, rtol=1e-6, atol=1e-6)


def test_axial_y_drives_first_quarter_of_pairs():
    a = build("rope_axial")((H, W))[0, 0]  # (N, d/2)
    q = HEAD_DIM // 4
    i, j = 0 * W + 2, 2 * W + 2  # (0, 2) and (2, 2): only y changes
    diff = (a[i] - a[j]).abs()
    assert (diff[:q] > 0).all() and (diff[q:] == 0).all()
    i, j = 1 * W + 0, 1 * W + 4  # (1, 0) and (1, 4): only x changes
    diff = (a[i] - a[j]).abs()
    assert (diff[:q] == 0).all() and (diff[q:] > 0).all()


def test_mixed_matches_reference_non_square():
    enc = build("rope_mixed")
    with torch.no_grad():
        enc.freqs.normal_()
    a = enc((H, W))
    assert a.shape == (1, HEADS, H * W, HEAD_DIM // 2)
    f = enc.freqs.detach().double()  # (heads, d/2, 2) as (fy, fx)
    for i in range(H * W):
        y, x = yx(i)
        torch.testing.assert_close(a[0, :, i].double(), f[..., 0] * y + f[..., 1] * x, rtol=1e-6, atol=1e-6)


def test_mixed_init_as_paper():
    torch.manual_seed(0)
    enc = build("rope_mixed", theta=10.0)
    f = enc.freqs.detach()  # (heads, d/2, 2)
    q = HEAD_DIM // 4
    mag = torch.tensor([10.0 ** (-4.0 * k / HEAD_DIM) for k in range(q)]).repeat(2)
    torch.testing.assert_close(f.norm(dim=-1), mag.expand(HEADS, -1))
    # per head: one direction for the first quarter of pairs, the orthogonal one for the second
    u = f / f.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(u[:, :q], u[:, :1].expand(-1, q, -1))
    torch.testing.assert_close((u[:, :q] * u[:, q:]).sum(-1), torch.zeros(HEADS, q), atol=1e-6, rtol=0)
    assert not torch.allclose(u[0, 0], u[1, 0])  # random direction per head


def test_mixed_unrotated_init_is_axial_with_x_first():
    mixed = build("rope_mixed", rotate=False, theta=10.0)
    axial = build("rope_axial", base=10.0)
    q = HEAD_DIM // 4
    a = axial((H, W))[0, 0]
    x_first = torch.cat([a[:, q:], a[:, :q]], dim=-1)
    torch.testing.assert_close(mixed((H, W))[0, 0], x_first)
    torch.testing.assert_close(mixed((H, W))[0, 1], x_first)


def scores(angles, q, k, p, p2, layout="half"):
    """<R(p) q, R(p2) k> per head; angles (1, heads|1, N, d/2), q, k (heads, d)."""
    a = angles[0].double()  # (heads|1, N, d/2)
    rq = apply_rope(q, a[:, p], layout)
    rk = apply_rope(k, a[:, p2], layout)
    return (rq * rk).sum(-1)  # (heads,)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(3, 5), (4, 4)])
def test_scores_depend_only_on_2d_offset(name, shape):
    h, w = shape
    torch.manual_seed(1)
    angles = build(name)(shape)
    q, k = torch.randn(HEADS, HEAD_DIM, dtype=torch.float64), torch.randn(HEADS, HEAD_DIM, dtype=torch.float64)
    tok = lambda y, x: y * w + x  # noqa: E731
    pairs_same_offset = [  # (query, key) position pairs with equal 2D offset within each group
        [((0, 1), (2, 3)), ((1, 0), (3, 2)) if h > 3 else ((0, 0), (2, 2))],
        [((2, 3), (0, 1)), ((2, 2), (0, 0))],
        [((0, 2), (1, 0)), ((1, 3), (2, 1))],
    ]
    for group in pairs_same_offset:
        s = [scores(angles, q, k, tok(*p), tok(*p2)) for p, p2 in group]
        torch.testing.assert_close(s[0], s[1], rtol=1e-5, atol=1e-5)
    # and the score does change with the offset (the check above can fail)
    s1 = scores(angles, q, k, tok(0, 1), tok(2, 3))
    s2 = scores(angles, q, k, tok(0, 1), tok(1, 3))
    s3 = scores(angles, q, k, tok(0, 1), tok(2, 2))
    assert (s1 - s2).abs().min() > 1e-4 and (s1 - s3).abs().min() > 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_rotation_preserves_norm(name):
    angles = build(name)((H, W))  # (1, heads|1, N, d/2)
    x = torch.randn(2, HEADS, H * W, HEAD_DIM, dtype=torch.float64)
    for layout in ("half", "interleaved"):
        torch.testing.assert_close(apply_rope(x, angles, layout).norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("name", NAMES)
def test_interleaved_layout_agrees_with_half_after_conversion(name):
    half, inter = build(name, layout="half"), build(name, layout="interleaved")
    assert (half.layout, inter.layout) == ("half", "interleaved")
    angles = half((H, W))
    x = torch.randn(2, HEADS, H * W, HEAD_DIM)
    want = half_to_interleaved(apply_rope(x, angles, half.layout))
    got = apply_rope(half_to_interleaved(x), angles, inter.layout)
    torch.testing.assert_close(got, want)
    # the wrong pairing gives something else (the conversion matters)
    assert not torch.allclose(apply_rope(half_to_interleaved(x), angles, "half"), want, atol=1e-3)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("coords", ["index", "normalized", "centered"])
def test_mask_batch_invariance(name, coords):
    enc = build(name, coords=coords)
    alone = enc((H, W))  # (1, heads|1, N, d/2) the image by itself
    mask = torch.zeros(2, H + 2, W + 1, dtype=torch.bool)
    mask[0, H:, :] = True  # image 0: the 3x5 image padded to 5x6
    mask[0, :, W:] = True
    padded = enc((H + 2, W + 1), mask)  # (2, heads|1, 5*6, d/2)
    assert padded.shape[0] == 2
    valid = padded[0].reshape(padded.shape[1], H + 2, W + 1, -1)[:, :H, :W].reshape(padded.shape[1], H * W, -1)
    torch.testing.assert_close(valid, alone[0])
    full = enc((H + 2, W + 1))  # image 1 has no padding: same as without a mask
    torch.testing.assert_close(padded[1], full[0])
    assert torch.isfinite(padded).all()


def test_jitter_and_shift_only_in_training():
    enc = build("rope_axial", shift=0.5, jitter=0.25)
    fixed = enc((H, W))
    torch.testing.assert_close(fixed, build("rope_axial")((H, W)))  # eval: no augmentation
    enc.train()
    a, b = enc((H, W)), enc((H, W))
    assert not torch.allclose(a, fixed) and not torch.allclose(a, b)  # random, not cached
    assert (a - fixed).abs().max() <= (0.5 + 0.25) * 1.0 + 1e-5  # bounded by shift + jitter (freq <= 1)
    enc.eval()
    torch.testing.assert_close(enc((H, W)), fixed)


@pytest.mark.parametrize("name", NAMES)
def test_float32_under_bf16_autocast(name):
    enc = build(name, coords="centered", scale=13.0)
    ref = enc((7, 9))
    enc._cache.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = enc((7, 9))
    assert got.dtype == torch.float32
    assert torch.equal(got, ref)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (32, 32)])
def test_forward_backward_finite(name, shape):
    enc = build(name).train()
    angles = enc(shape)
    x = torch.randn(1, HEADS, shape[0] * shape[1], HEAD_DIM, requires_grad=True)
    out = apply_rope(x, angles, enc.layout)
    out.square().sum().backward()
    assert torch.isfinite(angles).all() and torch.isfinite(x.grad).all()
    for p in enc.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_only_parameters_and_round_trip(name):
    enc = build(name)
    enc((H, W))  # fill the cache
    sd = enc.state_dict()
    assert set(sd) == {n for n, _ in enc.named_parameters()}
    assert set(sd) == (set() if name == "rope_axial" else {"freqs"})
    other = build(name)
    other.load_state_dict(sd)
    torch.testing.assert_close(other((4, 6)), enc((4, 6)))


@pytest.mark.parametrize("name", NAMES)
def test_uniform_build_kwargs(name):
    enc = vispe.build(name, dim=HEADS * HEAD_DIM, num_heads=HEADS, head_dim=HEAD_DIM, grid=(3, 5),
                      num_prefix_tokens=1)
    assert enc.family == "rotary" and enc((3, 5)).shape[-2:] == (15, HEAD_DIM // 2)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kw, arg", [
    (dict(head_dim=18), "head_dim"),
    (dict(head_dim=0), "head_dim"),
    (dict(num_heads=0), "num_heads"),
    (dict(dim=HEADS * HEAD_DIM + 1), "dim"),
    (dict(layout="rotate"), "layout"),
    (dict(coords="pixel"), "coords"),
    (dict(scale=0.0), "scale"),
    (dict(shift=-1.0), "shift"),
    (dict(jitter=-0.1), "jitter"),
    (dict(grid=(0, 3)), "grid"),
    (dict(num_prefix_tokens=-1), "num_prefix_tokens"),
])
def test_bad_arguments(name, kw, arg):
    with pytest.raises(ValueError, match=arg):
        build(name, **kw)


def test_bad_family_specific_arguments():
    with pytest.raises(ValueError, match="base"):
        build("rope_axial", base=-1.0)
    with pytest.raises(ValueError, match="theta"):
        build("rope_mixed", theta=0.0)
    with pytest.raises(ValueError, match="rotate"):
        build("rope_mixed", rotate="yes")


@pytest.mark.parametrize("name", NAMES)
def test_bad_forward_input(name):
    enc = build(name)
    with pytest.raises(ValueError, match="shape"):
        enc((0, 4))
    with pytest.raises(ValueError, match="mask"):
        enc((3, 5), torch.zeros(1, 5, 3, dtype=torch.bool))  # (w, h) swapped

