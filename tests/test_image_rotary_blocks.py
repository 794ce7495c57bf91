"""Block-rotation encodings (issue 38): LieRE, ComRoPE, STRING against faithful copies of their
references' formulas on a non-square grid, element by element; the relative property where the
papers claim it (and LieRE's non-commuting blocks, where it fails); orthogonality; the exportable
matrix exponential; the block kernel; STRING's fold of P into the projection; grid change (whole
ViT, compile and export: test_image_rotary_blocks_vit.py)."""
from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

from vispe import lie
from vispe.image.comrope import ComRoPE
from vispe.image.liere import LieRE
from vispe.image.string import STRING, fold_string_, real_fourier_basis
from vispe.kernels.rope_blocks import apply_blocks, block_rotation_matrix
from vispe.models.vit import create_vit
from vispe.registry import build

GRID = (3, 5)  # non-square: a y/x swap cannot cancel


# --- the math -----------------------------------------------------------------------------------
def test_expm_matches_torch_and_is_orthogonal_also_as_traced():
    torch.manual_seed(0)
    a = lie.skew(torch.randn(40, 8, 8)) * torch.logspace(-2, 0.7, 40)[:, None, None]  # |a| up to ~60
    want = torch.linalg.matrix_exp(a.double())
    for traced in (False, True):  # the fixed-squaring form recorded by export: same numbers
        with mock.patch("vispe._tracing.is_tracing", return_value=traced):
            e = lie.expm(a)
        torch.testing.assert_close(e.double(), want, rtol=0, atol=2e-5)
        assert (e.transpose(-1, -2) @ e - torch.eye(8)).abs().max() < 1e-5
    s = lie.skew_from_upper(torch.randn(3, 6, 6))
    with mock.patch("vispe._tracing.is_tracing", return_value=True):  # Newton-Schulz, not solve
        p = lie.cayley(s)
    torch.testing.assert_close(p, (torch.eye(6) - s) @ torch.linalg.inv(torch.eye(6) + s), rtol=0, atol=1e-5)
    torch.testing.assert_close(lie.cayley(s), p, rtol=0, atol=1e-5)


def test_block_kernel_layouts_and_the_full_matrix():
    torch.manual_seed(0)
    R = lie.expm(lie.skew(torch.randn(1, 2, 5, 3, 4, 4)))  # (B, H, N, nb, b, b), head_dim 12
    x = torch.randn(2, 1, 2, 5, 12)  # (2, B, H, N, d): q and k stacked
    for layout in ("interleaved", "half"):
        full = block_rotation_matrix(R, layout)  # (B, H, N, 12, 12)
        torch.testing.assert_close(apply_blocks(x, R, layout), (full @ x[..., None]).squeeze(-1), rtol=1e-5, atol=1e-5)
    chan = lie.block_channels(12, 4, "half")
    assert chan[1].tolist() == [1, 4, 7, 10] and lie.block_channels(12, 4, "interleaved")[1].tolist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="expected"):
        apply_blocks(x, R[..., :3, :3], "interleaved")


# --- LieRE against its reference ------------------------------------------------------------------
def liere_reference(raw, steps, expected_steps):
    """models/rope_vit.py (StanfordMIMI/LieRE): PositionEncoderBase.forward (sequential positions) and
    LierePositionEncoder.forward, phase_type "naver", one layer: raw (2, heads * nb, b, b).  # (1, N, G, b, b)"""
    max_values = tuple(s / e for s, e in zip(steps, expected_steps))
    positions = torch.cartesian_prod(*(torch.linspace(0, m, s) for m, s in zip(max_values, steps)))[None]
    upper = torch.triu(raw, diagonal=1) - 0.5
    bases = upper - torch.transpose(upper, -1, -2)
    in_basis_positions = positions.reshape(list(positions.shape) + [1] * 3) * bases
    generator_pos = torch.sum(in_basis_positions, dim=-4)
    return torch.matrix_exp(generator_pos.to(torch.float64))


def liere_apply_reference(x, transforms, heads):
    """FlexibleAttention.apply_transforms: x (B, heads, N, d), transforms (1, N, heads * nb, b, b)."""
    b = transforms.shape[-1]
    B, H, N, d = x.shape
    nb = transforms.shape[-3] // heads
    split = x.reshape(B, H, N, nb, b, 1)
    t = transforms.view(1, N, heads, nb, b, b).transpose(1, 2)
    return torch.matmul(t, split).flatten(start_dim=-3)


@pytest.mark.parametrize("block", [8, 4, 2])
def test_liere_equals_its_reference_at_the_training_grid_and_another(block):
    torch.manual_seed(0)
    H, d = 2, 8
    pe = LieRE(d, H, block_size=block, grid=GRID).eval()
    raw = pe.generators.detach().transpose(0, 1).reshape(2, H * (d // block), block, block)  # the reference's layout
    x = torch.randn(1, H, 4 * 7, d, dtype=torch.float64)
    for steps in (GRID, (4, 7)):  # the training grid: linspace(0, 1, n); a larger one: linspace(0, n / n0, n)
        ref = liere_reference(raw.double(), steps, GRID)  # (1, N, H * nb, b, b)
        N = steps[0] * steps[1]
        got = pe(steps)  # (1, H, N, nb, b, b), or angles for b = 2
        if block == 2:
            got = lie.rotation_2x2(got)
        # the blocks: float32 exponentials against the reference's float64 ones
        got_ref_layout = got.transpose(1, 2).reshape(1, N, -1, block, block).double()  # (1, N, H * nb, b, b)
        torch.testing.assert_close(got_ref_layout, ref, rtol=0, atol=2e-5)
        # the application: the kernel's layout against the reference's, both in float64 on the same
        # blocks, so float32 rounding of the blocks (up to 2e-5, times |x|) cannot fail it by chance
        want = liere_apply_reference(x[:, :, :N], got_ref_layout, H)
        rotated = apply_blocks(x[:, :, :N], got.double(), "interleaved")
        torch.testing.assert_close(rotated, want, rtol=0, atol=1e-12)


def _logits(R, q, k):
    """(R_i q) . (R_j k) for every token pair, R block rotations (1, 1, N, nb, b, b) or angles.  # (N, N)"""
    if R.shape[-1] != R.shape[-2] or R.dim() == 4:
        R = lie.rotation_2x2(R)
    rq = apply_blocks(q.expand(R.shape[2], -1), R[0, 0].double(), "interleaved")
    rk = apply_blocks(k.expand(R.shape[2], -1), R[0, 0].double(), "interleaved")
    return rq @ rk.t()


def _offset_spread(logits, shape):
    """The largest difference between logits of token pairs with the same (dy, dx) offset."""
    h, w = shape
    c = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(-1, 2)
    off = (c[None] - c[:, None]).reshape(-1, 2)
    key = (off[:, 0] + h) * (2 * w + 1) + off[:, 1] + w
    vals = logits.detach().reshape(-1)
    spread = 0.0
    for kk in key.unique():
        v = vals[key == kk]
        spread = max(spread, float(v.max() - v.min()))
    return spread


def _papers_generators(name, kw, pe):
    """Head 0's generators (G_y, G_x), (d, d) float64 in the layout's channel order, as each paper
    defines them from the encoding's parameters, and each axis's coordinate step between neighbouring
    cells (``coords`` of each encoding on ``GRID``, its training grid): for commuting generators the
    logits of query i and key j are q^T exp(o_y G_y + o_x G_x) k, o = steps * (key cell - query cell)."""
    h, w = GRID
    if name == "liere":  # exp(sum_k p_k A_k), p in [0, 1] over the training grid (linspace(0, 1, n))
        A = pe.generator_matrices().detach().double()[0]  # (2, nb, b, b)
        gens, steps = [torch.block_diag(*A[k]) for k in range(2)], (1 / (h - 1), 1 / (w - 1))
    elif name == "comrope":  # exp(y A_y) exp(x A_x), unit coordinates (i + 0.5) / n
        A = pe.axis_generators().detach().double()[0]  # (2, nb, b, b)
        gens, steps = [torch.block_diag(*A[k]) for k in range(2)], (1 / h, 1 / w)
    elif kw["variant"] == "cayley":  # P^T R(p) = exp(sum_k p_k P^T Lambda_k P), p the cell index
        P = pe.basis().detach().double()[0]  # (d, d), interleaved pairs (2i, 2i + 1)
        f = pe.frequencies().detach().double()[0]  # (d/2, 2) as (fy, fx)
        gens, i = [], torch.arange(f.shape[0])
        for k in range(2):
            lam = torch.zeros(2 * len(i), 2 * len(i), dtype=torch.float64)
            lam[2 * i + 1, 2 * i], lam[2 * i, 2 * i + 1] = f[:, k], -f[:, k]  # RoPE: (x1, x2) -> (x1 cos - x2 sin, ..)
            gens.append(P.t() @ lam @ P)
        steps = (1.0, 1.0)
    else:  # circulant: F^T R(p) = exp(sum_k p_k (C_k - C_k^T)), C_k[i, j] = c_k[(j - i) mod b]
        c = pe.first_rows().detach().double()[0, :, 0]  # (2, b): y then x
        b = c.shape[-1]
        idx = (torch.arange(b)[None] - torch.arange(b)[:, None]) % b
        gens, steps = [c[k][idx] - c[k][idx].t() for k in range(2)], (1.0, 1.0)
    return gens, steps


def _papers_logits(gens, steps, q, k):
    """q^T exp(o_y G_y + o_x G_x) k for every (query, key) pair of ``GRID``.  # (N, N)"""
    h, w = GRID
    cells = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(-1, 2).double()
    off = (cells[None] - cells[:, None]) * torch.tensor(steps, dtype=torch.float64)  # (N, N, 2) key minus query
    M = torch.linalg.matrix_exp(off[..., 0, None, None] * gens[0] + off[..., 1, None, None] * gens[1])  # (N, N, d, d)
    return torch.einsum("a,ijab,b->ij", q, M, k)


@pytest.mark.parametrize("name, kw, relative", [
    ("liere", dict(block_size=2), True), ("liere", dict(block_size=4), False),
    ("comrope", dict(variant="ld", block_size=4), True), ("comrope", dict(variant="ap", block_size=4), True),
    ("string", dict(variant="cayley", cayley_std=0.5), True), ("string", dict(variant="circulant", block_size=8), True),
])
def test_relative_property_where_the_papers_claim_it(name, kw, relative):
    """Logits depend only on the offset for commuting generators, and as the paper says: q^T exp(o_y G_y
    + o_x G_x) k with the paper's generators of each axis (a whole-rotation sign flip or a y/x swap
    keeps logits relative, not equal to these); LieRE's non-commuting blocks do not have the property
    (the test documents it: the spread is large)."""
    torch.manual_seed(0)
    pe = build(name, head_dim=8, num_heads=1, grid=GRID, **kw).eval()
    with torch.no_grad():  # generators that turn visibly across the grid (LieRE's init is already large)
        for pname, p in pe.named_parameters():
            if name != "liere" or pname != "generators":
                p.normal_(0, 0.5)
    R = pe(GRID).double()
    if R.dim() == 6:  # block rotations are orthogonal
        eye = torch.eye(R.shape[-1], dtype=R.dtype)
        assert (R.transpose(-1, -2) @ R - eye).abs().max() < 1e-5
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    logits = _logits(R, q, k)
    spread = _offset_spread(logits, GRID)
    if not relative:
        assert spread > 1e-2, spread  # exp(A + B) != exp(A) exp(B)
        return
    assert spread < 1e-4, spread
    (gy, gx), steps = _papers_generators(name, kw, pe)
    want = _papers_logits((gy, gx), steps, q, k)
    torch.testing.assert_close(logits, want, rtol=0, atol=1e-4)
    for wrong in ((-gy, -gx), (gx, gy)):  # what the check sees: a sign flip, a y/x swap
        assert (_papers_logits(wrong, steps, q, k) - want).abs().max() > 0.02


# --- ComRoPE against its reference -----------------------------------------------------------------
def comrope_reference(exponent, positions, head_dim, block):
    """model.py (Longin-Yu/ComRoPE), RoPESelfAttentionBase.get_rotation_matrix: exponent (heads|1, axes,
    nb, b, b), positions (bs, len, axes).  # (bs, len, heads, head_dim, head_dim)"""
    eye = torch.eye(block, dtype=exponent.dtype)
    positions = positions.unsqueeze(-1).unsqueeze(-1).unsqueeze(-1)
    positions = positions * eye
    positions = positions.unsqueeze(2)
    lnR = torch.matmul(exponent, positions).sum(dim=3)
    R = torch.matrix_exp(lnR)
    selector = torch.kron(torch.eye(head_dim // block, dtype=torch.bool), torch.ones(block, block, dtype=torch.bool))
    diagR = torch.zeros(*(R.shape[:3]), head_dim, head_dim, dtype=R.dtype)
    diagR[:, :, :, selector] = R.view(*(R.shape[:3]), -1)
    return diagR


@pytest.mark.parametrize("variant", ["ld", "ap"])
def test_comrope_equals_its_reference_on_a_non_square_grid(variant):
    H, d, b = 2, 8, 2 if variant == "ap" else 4
    torch.manual_seed(1)
    freqs = torch.randn(H, 1, d // b, b, b, dtype=torch.float64)  # the reference's parameters
    multiplier = torch.randn(1, 2, d // b, 1, 1, dtype=torch.float64)
    skew = freqs - freqs.transpose(-1, -2)
    if variant == "ld":
        exponent = skew * multiplier
    else:
        mask = torch.zeros(2, d // b, dtype=torch.float64)
        for i in range(2):
            mask[i, i::2] = 1.0
        exponent = skew.expand(-1, 2, -1, -1, -1) * mask.view(1, 2, d // b, 1, 1)
    h, w = GRID
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    positions = (torch.stack([ys, xs], -1).reshape(1, -1, 2) + 0.5) / torch.tensor([h, w], dtype=torch.float64)  # (i + 0.5) / n
    ref = comrope_reference(exponent, positions, d, b)  # (1, N, H, d, d)
    pe = ComRoPE(d, H, variant=variant, block_size=b)
    with torch.no_grad():
        pe.upper.copy_(skew[:, 0].float())
        if variant == "ld":
            pe.multiplier.copy_(multiplier.view(2, d // b).float())
    got = pe(GRID)
    if b == 2:
        got = lie.rotation_2x2(got)
    full = block_rotation_matrix(got, "interleaved").transpose(1, 2)  # (1, N, H, d, d)
    torch.testing.assert_close(full.double(), ref, rtol=0, atol=2e-5)


# --- STRING: the paper's exp of commuting generators ----------------------------------------------
def test_string_cayley_is_the_exponential_of_commuting_generators_up_to_its_left_factor():
    """P^T R(p) = exp(sum_k p_k L_k) with L_k = P^T Lambda_k P, Lambda_k the RoPE generator of axis k
    (2 x 2 skew blocks of the learned frequencies), P = (I - S)(I + S)^-1; and R(p) = RoPE(p) P."""
    torch.manual_seed(2)
    H, d = 2, 8
    pe = STRING(d, H, cayley_std=0.4, layout="half").eval()
    S = lie.skew_from_upper(pe.S.detach().double())
    P = (torch.eye(d, dtype=torch.float64) - S) @ torch.linalg.inv(torch.eye(d, dtype=torch.float64) + S)
    got = pe(GRID).double()[:, :, :, 0]  # (1, H, N, d, d)
    coords = torch.stack(torch.meshgrid(torch.arange(3.0), torch.arange(5.0), indexing="ij"), -1).reshape(-1, 2).double()
    f = pe.freqs.detach().double()  # (H, d/2, 2) as (fy, fx), pairs (i, i + d/2)
    for h in range(H):
        for n in (0, 7, 14):
            gen = torch.zeros(d, d, dtype=torch.float64)
            for k in range(2):
                lam = torch.zeros(d, d, dtype=torch.float64)
                i = torch.arange(d // 2)
                lam[i + d // 2, i], lam[i, i + d // 2] = f[h, :, k], -f[h, :, k]
                gen += coords[n, k] * (P[h].t() @ lam @ P[h])
            torch.testing.assert_close(P[h].t() @ got[0, h, n], torch.linalg.matrix_exp(gen), rtol=0, atol=2e-5)


def test_string_circulant_is_the_papers_fft_form():
    """exp(sum_k p_k (C_k - C_k^T)) z computed as the paper does (eigenvalues by FFT, Theorem 3.5)
    equals F^T R(p) z: F the real Fourier basis, R what the encoding returns."""
    torch.manual_seed(3)
    pe = STRING(8, 1, variant="circulant", block_size=8).eval()
    with torch.no_grad():
        pe.c.normal_(0, 0.3)
    c = pe.first_rows().double()[0, :, 0]  # (2, b): first rows, y then x
    R = pe(GRID).double()[0, 0, :, 0]  # (N, b, b)
    F = real_fourier_basis(8).double()
    coords = torch.stack(torch.meshgrid(torch.arange(3.0), torch.arange(5.0), indexing="ij"), -1).reshape(-1, 2).double()
    z = torch.randn(8, dtype=torch.float64)
    for n in (0, 6, 14):
        # the FFT form: circulant C with first row c has eigenvalues fft of its first column
        col = torch.stack([c[k].roll(0).flip(0).roll(1) for k in range(2)])  # first columns c[(-i) mod b]
        lam = torch.fft.fft(col)  # eigenvalues of C_k
        mu = coords[n, 0] * (lam[0] - lam[0].conj()) + coords[n, 1] * (lam[1] - lam[1].conj())
        fft_form = torch.fft.ifft(torch.exp(mu) * torch.fft.fft(z)).real
        dense = torch.linalg.matrix_exp(sum(coords[n, k] * (C - C.t()) for k, C in
                                            enumerate(torch.stack([c[k][(torch.arange(8)[None] - torch.arange(8)[:, None]) % 8]
                                                                   for k in range(2)]))))
        torch.testing.assert_close(fft_form, dense @ z, rtol=0, atol=1e-9)  # the reference formula is exp(L)
        torch.testing.assert_close(F.t() @ R[n] @ z, fft_form, rtol=0, atol=2e-5)


def test_string_fold_into_the_projection_is_exact_and_leaves_angles():
    torch.manual_seed(4)
    for variant in ("cayley", "circulant"):
        m = create_vit("vit_pico", pe="string", pe_kwargs=dict(variant=variant, cayley_std=0.3) if variant == "cayley"
                       else dict(variant=variant), embed_dim=32, depth=2, num_heads=2, img_size=(12, 16), patch_size=4,
                       num_classes=3, class_token=True).eval()
        x = torch.randn(2, 3, 12, 16)
        with torch.no_grad():
            before = m(x)
            assert fold_string_(m) == 2
            after = m(x)
        torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-5)
        pe = m.blocks[0].attn.pe
        assert pe.folded and pe.block_size == 2 and pe((3, 4)).shape == (1, 2, 12, 8)
        assert not any(k.endswith(".S") for k in m.state_dict())
    m = create_vit("vit_pico", pe="string", embed_dim=32, depth=1, num_heads=2, qk_norm=True, num_classes=3)
    with pytest.raises(ValueError, match="q_norm"):
        fold_string_(m)


# --- caching, grid change, options -----------------------------------------------------------------
def test_frozen_rotations_are_cached_in_eval_and_recomputed_after_an_update():
    pe = LieRE(8, 2, block_size=4, grid=GRID).eval()
    from vispe.kernels.rope_blocks import rotations_for

    with torch.no_grad():
        a = rotations_for(pe, (4, 4), None, 1, torch.device("cpu"))
        assert rotations_for(pe, (4, 4), None, 1, torch.device("cpu")) is a  # cached
        pe.generators.add_(0.1)  # an optimiser step
        b = rotations_for(pe, (4, 4), None, 1, torch.device("cpu"))
    assert b is not a and (b - a).abs().max() > 1e-3
    assert torch.equal(a[:, :, 0], torch.eye(4).expand_as(a[:, :, 0]))  # the prefix token: identity
    c = rotations_for(pe, (4, 4), None, 1, torch.device("cpu"))  # grad enabled: not cached
    assert c.requires_grad and c is not rotations_for(pe, (4, 4), None, 1, torch.device("cpu"))


def test_padded_batch_rotations_equal_each_image_alone():
    """One exponential per distinct coordinate of the batch; each image's rotations are its own."""
    pe = LieRE(8, 2, grid=GRID).eval()
    mask = torch.ones(2, 4, 6, dtype=torch.bool)
    mask[0, :3, :5] = False
    mask[1, 1:, 2:] = False  # a 3 x 4 image at the bottom right
    with torch.no_grad():
        both = pe((4, 6), mask)  # (2, H, 24, 1, 8, 8)
        alone0, alone1 = pe((3, 5)), pe((3, 4))
    torch.testing.assert_close(both[0].view(2, 4, 6, 1, 8, 8)[:, :3, :5].reshape(2, 15, 1, 8, 8), alone0[0])
    torch.testing.assert_close(both[1].view(2, 4, 6, 1, 8, 8)[:, 1:, 2:].reshape(2, 12, 1, 8, 8), alone1[0])


def test_grid_change_what_each_does_at_another_size():
    # LieRE extrapolates: on a 2x grid the last coordinate is 2 (n / n0), the reference's linspace(0, n / n0, n)
    pe = LieRE(8, 1, grid=(4, 4))
    assert pe.convention(torch.tensor([[[1.0, 1.0]]]), torch.tensor([[[8.0, 8.0]]])).tolist() == [[[2.0, 2.0]]]
    # ... and a checkpoint for another grid is rescaled so that every rotation stays the same
    other = LieRE(8, 1, grid=(8, 2))
    other.load_state_dict(pe.state_dict())
    torch.testing.assert_close(other((6, 7)), pe((6, 7)), rtol=1e-5, atol=1e-5)
    # ComRoPE interpolates: unit coordinates (i + 0.5) / n at every size
    cr = ComRoPE(8, 1, block_size=2)
    small, big = cr((2, 2)), cr((4, 4))
    torch.testing.assert_close(small[0, 0, 0], -(0.25 * cr.axis_generators()[0, :, :, 0, 1]).sum(0))
    torch.testing.assert_close(big[0, 0, 0], -(0.125 * cr.axis_generators()[0, :, :, 0, 1]).sum(0))
    # STRING counts cells (RoPE's index coordinates): PI scales them past the training grid
    st = STRING(8, 1, scaling="pi", ref_grid=(2, 2), cayley_std=0.3).eval()
    plain = STRING(8, 1, cayley_std=0.3).eval()
    plain.load_state_dict(st.state_dict())
    torch.testing.assert_close(st((4, 4)).view(1, 1, 4, 4, 1, 8, 8)[:, :, 2, 2], plain((2, 2)).view(1, 1, 2, 2, 1, 8, 8)[:, :, 1, 1])


@pytest.mark.parametrize("cls, kw", [(LieRE, dict(block_size=4, grid=GRID)), (ComRoPE, dict(block_size=4)),
                                     (STRING, dict(cayley_std=0.3))])
def test_at_cell_centres_equals_the_grid_so_anchored_queries_meet_grid_keys(cls, kw):
    """Cross-attention rotates queries at anchors (``at``) and keys on the grid: at the cell centres
    (i + 0.5) / n the two agree, with a padding extent too."""
    pe = cls(8, 2, **kw).eval()
    h, w = GRID
    centres = torch.stack(torch.meshgrid((torch.arange(h) + 0.5) / h, (torch.arange(w) + 0.5) / w, indexing="ij"),
                          -1).reshape(1, -1, 2)
    torch.testing.assert_close(pe.at(centres, torch.tensor([[float(h), float(w)]])), pe(GRID), rtol=1e-5, atol=1e-5)


def test_options_are_checked():
    with pytest.raises(ValueError, match="block_size=3"):
        LieRE(8, 2, block_size=3)
    with pytest.raises(ValueError, match="layout='half' with block_size=8"):
        LieRE(8, 2, layout="half")
    with pytest.raises(ValueError, match="scaling='pi'"):
        LieRE(8, 2, scaling="pi", ref_grid=(2, 2))
    with pytest.raises(ValueError, match="even number of blocks"):
        ComRoPE(12, 2, variant="ap", block_size=4)
    with pytest.raises(ValueError, match="variant='circulant'"):
        STRING(8, 2, variant="circulant", layout="half")
    with pytest.raises(ValueError, match="block_size=4 with variant='cayley'"):
        STRING(8, 2, block_size=4)
    with pytest.raises(ValueError, match="extent=None"):
        LieRE(8, 2, grid=GRID).at(torch.rand(1, 3, 2))
    assert math.isclose(LieRE(8, 2).init_scale, 2 * math.pi)
