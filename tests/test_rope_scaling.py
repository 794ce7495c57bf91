"""RoPE resolution scaling (issue 27): ``scaling`` "pi" / "ntk" / "yarn" of rope_axial and rope_mixed.

Each formula against an independent copy of its reference written here (Chen et al.'s PI, FiT's
NTK base formula, the YaRN paper's by-parts rule, and FiT's copy of the YaRN code where the two
must agree), the identity at the training grid, the relative property after scaling, per-axis vs
tied on a non-square grid, masks (one factor per image), the continuous ``at`` path, float32 under
bf16 autocast and the errors.
"""
from __future__ import annotations

import math

import pytest
import torch

import vispe
from vispe.axis.rope import apply_rope
from vispe.image.rope_axial import period_frequencies

HD, HEADS = 16, 2
K = HD // 4  # frequencies per axis
REF = (3, 4)  # training grid, non-square
AXIAL = [("rope_axial", s) for s in ("pi", "ntk", "yarn")]
MIXED = [("rope_mixed", s) for s in ("pi", "yarn")]
ALL = AXIAL + MIXED


def build(name, **kw):
    torch.manual_seed(0)  # rope_mixed's random initial directions: the same for every build
    return vispe.build(name, head_dim=HD, num_heads=HEADS, **kw).eval()


# --- independent references -----------------------------------------------------------------
def fit_freqs(theta, d):
    """FiT's per-axis frequencies, ``1 / theta^(arange(0, d, 2) / d)``, d = head_dim / 2 (float64)."""
    return 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)


def fit_ntk(theta, d, s):
    """FiT's ``find_newbase_ntk`` and NTK-aware frequencies: base * s^(d/(d-2))."""
    return 1.0 / (theta * s ** (d / (d - 2))) ** (torch.arange(0, d, 2, dtype=torch.float64) / d)


def paper_yarn(theta_d, s, L, alpha=1.0, beta=32.0):
    """YaRN, Peng et al. 2023, eq. 17-18, written as in the paper: r = L / lambda, lambda = 2 pi / theta."""
    out = []
    for t in theta_d.tolist():
        r = L / (2 * math.pi / abs(t))
        g = 0.0 if r < alpha else 1.0 if r > beta else (r - alpha) / (beta - alpha)
        out.append((1 - g) * t / s + g * t)
    return torch.tensor(out, dtype=torch.float64)


def fit_yarn(theta, d, s, L, beta_fast=32, beta_slow=1):
    """FiT's / jquesnelle's YaRN code: a ramp linear in the pair index between floor / ceil of the
    indices where the number of turns is beta_fast and beta_slow. Returns (freqs, mask)."""
    def factor(num_rot):
        return (d * math.log(L / (num_rot * 2 * math.pi))) / (2 * math.log(theta))
    low = max(math.floor(factor(beta_fast)), 0)
    high = min(math.ceil(factor(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    mask = 1 - ramp  # 1 = extrapolate (keep)
    extrap = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    return extrap / s * (1 - mask) + extrap * mask, mask


def grid_angles_ref(h, w, fy, fx, sy=1.0, sx=1.0):
    """Axial angles of an (h, w) index grid, y pairs first, positions divided by (sy, sx).  # (h*w, 2K)"""
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    y, x = y.reshape(-1, 1) / sy, x.reshape(-1, 1) / sx
    return torch.cat([y * fy, x * fx], -1)


def unit_of_index(p, n):
    """Unit coordinate of index position p on an n-cell axis (the inverse of ``u * n - 0.5``)."""
    return (p + 0.5) / n


# --- the identity where nothing is extended --------------------------------------------------
@pytest.mark.parametrize("name, scaling", ALL)
@pytest.mark.parametrize("axes", ["per_axis", "tied"])
def test_at_the_training_grid_every_scaling_equals_none_exactly(name, scaling, axes):
    pe = build(name, scaling=scaling, scaling_axes=axes, ref_grid=REF)
    none, eva = build(name), build(name, ref_grid=REF)
    assert torch.equal(pe(REF), none(REF)) and torch.equal(pe(REF), eva(REF))
    for smaller in ((2, 3), (1, 4), (3, 1)):  # not longer along either axis: s = 1, left as it is
        assert torch.equal(pe(smaller), none(smaller)), smaller
    mask = torch.ones(2, 5, 7, dtype=torch.bool)
    mask[0, :3, :4] = False  # image 0 is the training grid, image 1 the whole canvas
    mask[1] = False
    got, want = pe((5, 7), mask), none((5, 7), mask)
    assert torch.equal(got[0], want[0]) and not torch.equal(got[1], want[1])
    assert not torch.equal(pe((6, 8)), none((6, 8)))  # past the training grid it does act


def test_scaling_defaults_leave_every_existing_build_bit_for_bit():
    for name in ("rope_axial", "rope_mixed"):
        for kw in ({}, dict(ref_grid=REF), dict(coords="centered", scale=2 * math.pi)):
            a, b = build(name, **kw), build(name, scaling="none", **kw)
            assert torch.equal(a((5, 9)), b((5, 9))) and a.scaling == "none"


# --- each formula against its reference -------------------------------------------------------
@pytest.mark.parametrize("base", [100.0, 10000.0])
def test_pi_is_chen_et_al_position_interpolation(base):
    h, w = 6, 10  # s = (2, 2.5) against (3, 4)
    got = build("rope_axial", base=base, scaling="pi", ref_grid=REF)((h, w))[0, 0].double()
    f = fit_freqs(base, HD // 2)
    want = grid_angles_ref(h, w, f, f, h / REF[0], w / REF[1])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    # on grids larger than ref_grid, PI equals the EVA-02 rescale (coords * ref / n)
    torch.testing.assert_close(got.float(), build("rope_axial", base=base, ref_grid=REF)((h, w))[0, 0])


@pytest.mark.parametrize("base", [100.0, 10000.0])
def test_ntk_is_the_new_base_formula(base):
    h, w = 6, 10
    got = build("rope_axial", base=base, scaling="ntk", ref_grid=REF)((h, w))[0, 0].double()
    d = HD // 2
    want = grid_angles_ref(h, w, fit_ntk(base, d, h / REF[0]), fit_ntk(base, d, w / REF[1]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the highest frequency is kept, the lowest divided by exactly s
    fy = got[1 * w, :K]  # position (1, 0): the y frequencies themselves
    f = fit_freqs(base, d)
    torch.testing.assert_close(fy[[0, K - 1]], torch.stack([f[0], f[-1] / (h / REF[0])]), rtol=1e-6, atol=0)


def test_ntk_with_periods_stretches_the_largest_period():
    h, w = 6, 10
    kw = dict(min_period=0.5, max_period=40.0)
    got = build("rope_axial", scaling="ntk", ref_grid=REF, **kw)((h, w))[0, 0]
    fy = period_frequencies(K, 0.5, 40.0 * h / REF[0]).double()
    fx = period_frequencies(K, 0.5, 40.0 * w / REF[1]).double()
    torch.testing.assert_close(got.double(), grid_angles_ref(h, w, fy, fx), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ref, grid, base, hd", [((3, 4), (6, 10), 100.0, 16), ((64, 48), (128, 192), 10000.0, 64),
                                                 ((256, 256), (512, 384), 10000.0, 64)])
def test_yarn_is_the_papers_by_parts_rule(ref, grid, base, hd):
    """Through ``at`` at index position 1 of each axis (the frequencies themselves), so that the large
    training lengths the ramp needs do not build a 512x384 grid."""
    pe = vispe.build("rope_axial", head_dim=hd, num_heads=1, base=base, scaling="yarn", ref_grid=ref)
    n = torch.tensor([grid], dtype=torch.float64)
    u = torch.tensor([[[unit_of_index(1, grid[0]), unit_of_index(0, grid[1])],
                       [unit_of_index(0, grid[0]), unit_of_index(1, grid[1])]]], dtype=torch.float64)
    a = pe.at(u.float(), n.float())[0, 0].double()  # (2, hd/2)
    got_y, got_x = a[0, :hd // 4], a[1, hd // 4:]
    f = fit_freqs(base, hd // 2)
    want_y = paper_yarn(f, grid[0] / ref[0], ref[0])
    want_x = paper_yarn(f, grid[1] / ref[1], ref[1])
    torch.testing.assert_close(got_y, want_y, rtol=2e-5, atol=1e-7)
    torch.testing.assert_close(got_x, want_x, rtol=2e-5, atol=1e-7)
    # FiT's (the YaRN code's) index ramp: the same wherever it keeps or interpolates a pair fully, once
    # the training length reaches 2 pi beta (shorter, the code clamps its ramp to pair 0 and keeps it)
    for got, n_ax, L in ((got_y, grid[0], ref[0]), (got_x, grid[1], ref[1])):
        if L < 2 * math.pi * 32:
            fit, mask = fit_yarn(base, hd // 2, n_ax / L, L)
            assert mask[0] == 1 and got[0] < f[0] * (1 - 1e-3)  # the code keeps pair 0, the paper does not
            continue
        fit, mask = fit_yarn(base, hd // 2, n_ax / L, L)
        full = (mask == 0) | (mask == 1)
        assert full.any()
        torch.testing.assert_close(got[full], fit[full], rtol=2e-5, atol=1e-7)


def test_yarn_keeps_fast_pairs_and_interpolates_slow_ones():
    """At a training length where the ramp is crossed: the fastest pair is kept, the slowest is PI."""
    pe = vispe.build("rope_axial", head_dim=64, num_heads=1, base=10000.0, scaling="yarn", ref_grid=(256, 256))
    u = torch.tensor([[[unit_of_index(1, 512), unit_of_index(0, 512)]]])
    f = pe.at(u, torch.tensor([[512.0, 512.0]]))[0, 0, 0, :16].double()
    base = fit_freqs(10000.0, 32)
    assert f[0] == pytest.approx(base[0].item(), rel=1e-6) and f[-1] == pytest.approx(base[-1].item() / 2, rel=1e-5)
    # yarn_alpha / yarn_beta move the ramp: everything interpolated when no pair turns beta times
    pe2 = vispe.build("rope_axial", head_dim=64, num_heads=1, base=10000.0, scaling="yarn", ref_grid=(256, 256),
                      yarn_alpha=100.0, yarn_beta=200.0)
    f2 = pe2.at(u, torch.tensor([[512.0, 512.0]]))[0, 0, 0, :16].double()
    torch.testing.assert_close(f2, base / 2, rtol=1e-5, atol=0)


def test_yarn_of_rope_mixed_is_per_component():
    sc, beta = 16.0, 4.0  # some components past the ramp, some below it
    pe = build("rope_mixed", scaling="yarn", ref_grid=REF, scale=sc, yarn_beta=beta)
    none = build("rope_mixed", scale=sc)
    h, w = 6, 10
    f = none.freqs.detach().double()  # (heads, d/2, 2) as (fy, fx)
    fy = torch.stack([paper_yarn(f[hh, :, 0], h / REF[0], REF[0] * sc, beta=beta) for hh in range(HEADS)])  # (heads, d/2)
    fx = torch.stack([paper_yarn(f[hh, :, 1], w / REF[1], REF[1] * sc, beta=beta) for hh in range(HEADS)])
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    want = sc * (y.reshape(1, -1, 1) * fy[:, None] + x.reshape(1, -1, 1) * fx[:, None])  # (heads, N, d/2)
    torch.testing.assert_close(pe((h, w))[0].double(), want, rtol=1e-5, atol=1e-4)
    r = REF[0] * sc * f[..., 0].abs() / (2 * math.pi)
    assert (r > beta).any() and (r < 1).any()  # the check covers both ends of the ramp


def test_pi_of_rope_mixed_divides_the_positions():
    h, w = 6, 10
    got = build("rope_mixed", scaling="pi", ref_grid=REF)((h, w))
    f = build("rope_mixed").freqs.detach().double()
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    y, x = y.reshape(1, -1, 1) * REF[0] / h, x.reshape(1, -1, 1) * REF[1] / w
    want = y * f[:, None, :, 0] + x * f[:, None, :, 1]  # (heads, N, d/2)
    torch.testing.assert_close(got[0].double(), want, rtol=1e-5, atol=1e-6)


# --- properties after scaling -----------------------------------------------------------------
@pytest.mark.parametrize("name, scaling", ALL)
def test_logits_depend_only_on_the_offset_after_scaling(name, scaling):
    h, w = 6, 9
    angles = build(name, scaling=scaling, ref_grid=REF)((h, w))[0].double()  # (heads|1, N, d/2)
    torch.manual_seed(3)
    q, k = torch.randn(HEADS, 1, HD, dtype=torch.float64), torch.randn(HEADS, 1, HD, dtype=torch.float64)
    rq = apply_rope(q.expand(-1, h * w, -1), angles)  # the same vector at every position
    rk = apply_rope(k.expand(-1, h * w, -1), angles)
    logits = rq @ rk.transpose(-1, -2)  # (heads, N, N)
    pos = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(-1, 2)
    off = pos[:, None] - pos[None]  # (N, N, 2)
    key = (off[..., 0] + h) * (2 * w + 1) + off[..., 1] + w
    spread = 0.0
    for v in key.unique():
        sel = logits[:, key == v]  # (heads, pairs with this offset)
        spread = max(spread, (sel - sel[:, :1]).abs().max().item())
    assert spread < 1e-4
    assert logits.std() > 0.1  # and the logits do vary with the offset


def test_per_axis_and_tied_differ_on_a_non_square_grid():
    """ref (4, 4) at grid (8, 4): per axis only y is scaled; tied scales x by s_y = 2 too."""
    none = build("rope_axial")((8, 4))[0, 0]
    for scaling in ("pi", "ntk", "yarn"):
        per = build("rope_axial", scaling=scaling, ref_grid=(4, 4))((8, 4))[0, 0]
        tied = build("rope_axial", scaling=scaling, scaling_axes="tied", ref_grid=(4, 4))((8, 4))[0, 0]
        assert torch.equal(per[:, :K], tied[:, :K]) and not torch.equal(per[:, :K], none[:, :K])  # y: s = 2 in both
        assert torch.equal(per[:, K:], none[:, K:])  # x is not longer than in training: untouched
        assert not torch.allclose(tied[:, K:], none[:, K:])
        if scaling == "pi":
            torch.testing.assert_close(tied[:, K:], none[:, K:] / 2)


def test_a_padded_image_gets_its_own_factors_in_a_batch():
    for name, scaling in ALL:
        pe = build(name, scaling=scaling, ref_grid=REF)
        alone = pe((6, 7))  # s = (2, 1.75)
        mask = torch.ones(2, 9, 10, dtype=torch.bool)
        mask[0, :6, :7] = False
        mask[1, 1:4, 2:6] = False  # image 1: the training grid, at an offset
        both = pe((9, 10), mask)
        valid = both[0].reshape(both.shape[1], 9, 10, -1)[:, :6, :7].reshape(both.shape[1], 42, -1)
        torch.testing.assert_close(valid, alone[0], rtol=0, atol=0)
        inner = both[1].reshape(both.shape[1], 9, 10, -1)[:, 1:4, 2:6].reshape(both.shape[1], 12, -1)
        # an image at an offset counts its positions from the offset: equal up to float32 rounding
        # (bit-equal on the AMD EPYC CI machine, 1.2e-7 apart on an Intel Xeon); a wrong factor is off by O(1)
        torch.testing.assert_close(inner, pe(REF)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name, scaling", ALL)
@pytest.mark.parametrize("axes", ["per_axis", "tied"])
def test_at_cell_centres_equals_the_grid(name, scaling, axes):
    pe = build(name, scaling=scaling, scaling_axes=axes, ref_grid=REF)
    h, w = 7, 5
    u = torch.stack(torch.meshgrid((torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w, indexing="ij"), -1)
    got = pe.at(u.reshape(1, -1, 2), torch.tensor([[h, w]]))
    torch.testing.assert_close(got, pe((h, w)), rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="extent=None"):
        pe.at(u.reshape(1, -1, 2))


@pytest.mark.parametrize("name, scaling", ALL)
def test_float32_under_bf16_autocast(name, scaling):
    pe = build(name, scaling=scaling, ref_grid=REF)
    mask = torch.zeros(2, 7, 9, dtype=torch.bool)
    mask[0, 5:] = True
    for m in (None, mask):
        ref = pe((7, 9), m)
        pe._cache.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = pe((7, 9), m)
        assert low.dtype == torch.float32 and torch.equal(low, ref)


def test_fixed_key_tells_scalings_apart():
    keys = {build("rope_axial", **kw).fixed_key() for kw in
            ({}, dict(scaling="pi", ref_grid=REF), dict(scaling="ntk", ref_grid=REF), dict(scaling="yarn", ref_grid=REF),
             dict(scaling="yarn", ref_grid=REF, yarn_beta=8.0), dict(scaling="pi", ref_grid=REF, scaling_axes="tied"))}
    assert len(keys) == 6


def test_repr_names_the_scaling():
    assert "scaling='yarn'" in repr(build("rope_axial", scaling="yarn", ref_grid=REF))
    assert "scaling" not in repr(build("rope_axial"))


# --- errors name the argument and the value -----------------------------------------------------
BAD = [
    ("rope_axial", dict(scaling="linear"), "scaling='linear'"),
    ("rope_axial", dict(scaling="pi"), "ref_grid=None"),
    ("rope_axial", dict(scaling="pi", ref_grid=(0, 3)), "ref_grid"),
    ("rope_axial", dict(scaling="yarn", ref_grid=REF, coords="normalized"), "coords='normalized'"),
    ("rope_axial", dict(scaling="ntk", ref_grid=REF, coords="centered", normalize_coords="min"), "coords='centered'"),
    ("rope_axial", dict(scaling_axes="tied"), "scaling_axes='tied'"),
    ("rope_axial", dict(scaling="pi", ref_grid=REF, scaling_axes="both"), "scaling_axes='both'"),
    ("rope_axial", dict(scaling="pi", ref_grid=REF, yarn_beta=8.0), "yarn_beta=8.0"),
    ("rope_axial", dict(scaling="yarn", ref_grid=REF, yarn_alpha=0), "yarn_alpha=0"),
    ("rope_axial", dict(scaling="yarn", ref_grid=REF, yarn_alpha=4.0, yarn_beta=2.0), "yarn_alpha=4.0"),
    ("rope_axial", dict(scaling="yarn", ref_grid=REF, yarn_beta=float("inf")), "yarn_beta=inf"),
    ("rope_mixed", dict(scaling="ntk", ref_grid=REF), "scaling='ntk'"),
]


@pytest.mark.parametrize("name, kw, needle", BAD, ids=[f"{n}-{'-'.join(map(str, kw.values()))}" for n, kw, _ in BAD])
def test_bad_arguments_name_the_argument_and_value(name, kw, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        build(name, **kw)


def test_ntk_needs_two_frequencies_per_axis():
    with pytest.raises(ValueError, match="head_dim=4"):
        vispe.build("rope_axial", head_dim=4, num_heads=1, scaling="ntk", ref_grid=REF)
    vispe.build("rope_axial", head_dim=4, num_heads=1, scaling="yarn", ref_grid=REF)((5, 5))  # yarn does not need it


def test_rope_mixed_ntk_refusal_says_why():
    with pytest.raises(ValueError, match="no base"):
        build("rope_mixed", scaling="ntk", ref_grid=REF)
