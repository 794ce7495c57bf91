"""Issue 52: the factored rotations (STRING and ComRoPE in their eigenbasis, LieRE recomputed in
backward) equal today's block rotations (``method="blocks"``: one b x b matrix per token, applied
by ``apply_blocks`` and differentiated by autograd) in value and in every gradient, float32, on a
non-square grid, with a padding mask, prefix tokens, and at continuous coordinates (``at``)."""
from __future__ import annotations

import pytest
import torch

from vispe.image.comrope import ComRoPE
from vispe.image.liere import LieRE
from vispe.image.string import STRING
from vispe.kernels import rope_blocks
from vispe.kernels.rope_commuting import commuting_rotate, skew_schur

GRID = (3, 5)  # non-square: a y/x swap cannot cancel
H, D = 2, 16

CASES = [
    ("string-cayley", STRING, dict(variant="cayley", cayley_std=0.3)),
    ("string-cayley-half", STRING, dict(variant="cayley", cayley_std=0.3, layout="half")),
    ("string-circulant", STRING, dict(variant="circulant", block_size=8, circulant_std=0.3)),
    ("comrope-ld", ComRoPE, dict(variant="ld", block_size=4)),
    ("comrope-ld-half", ComRoPE, dict(variant="ld", block_size=4, layout="half")),
    ("comrope-ap", ComRoPE, dict(variant="ap", block_size=4)),
    ("comrope-ld-b8-index", ComRoPE, dict(variant="ld", block_size=8, coords="index")),
    ("liere", LieRE, dict(block_size=8, grid=GRID)),
    ("liere-dense", LieRE, dict(grid=GRID, init_scale=1.0)),
]


def _pe(cls, kw, prefix=0):
    torch.manual_seed(0)
    pe = cls(D, H, num_prefix_tokens=prefix, **kw)
    if cls is STRING and kw["variant"] == "cayley":
        with torch.no_grad():
            pe.freqs.mul_(1.7)  # away from the initialisation, which ties frequencies between heads
    return pe


def _compare(pe, run):
    """``run(method)`` -> output; output and gradients (input, every parameter) of the two methods."""
    params = [p for p in pe.parameters()]
    outs, grads = {}, {}
    for method in ("blocks", "auto"):
        torch.manual_seed(1)
        out, inputs = run(method)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
        outs[method] = out
        grads[method] = torch.autograd.grad((out * w).sum(), [*inputs, *params])
    torch.testing.assert_close(outs["auto"], outs["blocks"], rtol=1e-5, atol=1e-5)
    for ga, gb in zip(grads["auto"], grads["blocks"]):
        # a parameter's gradient sums over every token: 1e-5 of its largest entry (the float32 blocks
        # themselves are 1.3e-5 off a float64 matrix_exp on ComRoPE's multiplier, whose entries reach 16)
        torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-5 * max(1.0, gb.abs().max().item()))
    assert any(g.abs().max() > 1e-3 for g in grads["blocks"][1:])  # the parameters' gradients are not all 0


@pytest.mark.parametrize("name, cls, kw", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("masked", [False, True], ids=["grid", "mask"])
def test_factored_rotation_equals_the_blocks_with_prefix_tokens(name, cls, kw, masked):
    pe = _pe(cls, kw, prefix=1)
    mask = None
    B = 2
    if masked:
        mask = torch.ones(B, *GRID, dtype=torch.bool)
        mask[1, 2:, :] = False
        mask[1, :, 4:] = False
    L = 1 + GRID[0] * GRID[1]

    def run(method):
        torch.manual_seed(2)
        qk = torch.randn(2, B, H, L, D, requires_grad=True)
        return rope_blocks.rotate_qk(pe, qk, GRID, mask, 1, method=method), (qk,)

    _compare(pe, run)


@pytest.mark.parametrize("name, cls, kw", CASES, ids=[c[0] for c in CASES])
def test_factored_rotation_at_continuous_coordinates_equals_the_blocks(name, cls, kw):
    pe = _pe(cls, kw)

    def run(method):
        torch.manual_seed(3)
        x = torch.randn(2, H, 7, D, requires_grad=True)
        coords = torch.rand(2, 7, 2)
        extent = torch.tensor([[3.0, 5.0], [2.0, 4.0]])
        return rope_blocks.rotate_at(pe, x, coords, extent, method=method), (x,)

    _compare(pe, run)


def test_the_factored_path_is_taken_and_the_blocks_are_not_built():
    """STRING and ComRoPE never build a per-token matrix in training; LieRE keeps none for backward."""
    for cls, kw in ((STRING, dict(variant="cayley")), (ComRoPE, dict(block_size=4))):
        pe = _pe(cls, kw)
        f = pe.factors(GRID, None, torch.device("cpu"))
        assert f is not None and not any(t.dim() >= 5 and t.shape[-3] == GRID[0] * GRID[1] for t in f
                                         if isinstance(t, torch.Tensor))
    pe = _pe(LieRE, dict(block_size=8, grid=GRID))
    qk = torch.randn(2, 1, H, 15, D, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        rope_blocks.rotate_qk(pe, qk, GRID)
    assert sum(saved) < 4 * qk.numel()  # today's: N * H * nb * b * b for every Taylor step and squaring


# --- the commuting kernel: Schur form and its gradient --------------------------------------------
def test_skew_schur_reconstructs_the_generator_also_with_repeated_and_zero_planes():
    torch.manual_seed(0)
    Bm = torch.randn(3, 8, 8)
    Bm = Bm - Bm.transpose(-1, -2)
    Q, w, ok = skew_schur(Bm)
    J = torch.tensor([[0.0, -1.0], [1.0, 0.0]])
    blocks = torch.block_diag(*[J] * 4)
    for i in range(3):
        Bhat = blocks * w[i].repeat_interleave(2)[:, None]
        torch.testing.assert_close(Q[i] @ Bhat @ Q[i].t(), Bm[i], rtol=0, atol=1e-5)
        torch.testing.assert_close(Q[i].t() @ Q[i], torch.eye(8), rtol=0, atol=1e-5)
    assert bool(ok.all())
    rot = torch.linalg.qr(torch.randn(8, 8)).Q
    rep = rot @ torch.block_diag(*[J * 1.5] * 2, J * 0.0, J * 0.0) @ rot.t()  # repeated and zero frequencies
    Q, w, ok = skew_schur(rep[None])
    if bool(ok.all()):  # either a valid basis or the caller is told to fall back
        Bhat = blocks * w[0].repeat_interleave(2)[:, None]
        torch.testing.assert_close(Q[0] @ Bhat @ Q[0].t(), rep, rtol=0, atol=1e-5)


def test_commuting_gradient_equals_autograd_of_the_matrix_exponential_in_float64():
    """gradcheck against finite differences, and autograd through torch.linalg.matrix_exp, including
    equal frequencies where the eigenvector derivative would divide by zero."""
    torch.manual_seed(0)
    nb, b = 2, 4
    raw = torch.randn(1, nb, b, b, dtype=torch.float64)
    rot = torch.linalg.qr(torch.randn(b, b, dtype=torch.float64)).Q
    J = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)
    tied = rot @ torch.block_diag(J * 0.7, J * 0.7) @ rot.t()  # two equal frequencies
    Bm = (raw - raw.transpose(-1, -2)).clone()
    Bm[0, 1] = tied
    Bm.requires_grad_(True)
    t = torch.randn(1, 1, 5, nb, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 1, 1, 5, nb * b, dtype=torch.float64, requires_grad=True)
    out = commuting_rotate(x, t, Bm, "interleaved")
    R = torch.linalg.matrix_exp(t[..., None, None] * Bm[:, None])  # (1, 1, 5, nb, b, b)
    want = (R @ x.unflatten(-1, (nb, b))[..., None]).squeeze(-1).flatten(-2)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(out)
    got = torch.autograd.grad((out * g).sum(), (x, t, Bm))
    ref = torch.autograd.grad((want * g).sum(), (x, t, Bm))
    for a, r in zip(got, ref):
        torch.testing.assert_close(a, r, rtol=1e-9, atol=1e-9)
    raw = raw.clone().requires_grad_(True)  # finite differences of a skew-symmetric B: through B = raw - raw^T
    assert torch.autograd.gradcheck(lambda x, t, r: commuting_rotate(x, t, r - r.transpose(-1, -2), "half"), (x, t, raw))


def test_expm_squarings_come_from_the_norm_and_match_torch():
    """The squarings follow a bound on the norm (fewer with the tighter ``normal`` bound of a
    skew-symmetric matrix, or a caller's bound), not a fixed 16, and the result matches
    torch.linalg.matrix_exp at every scale, eager and as recorded (per-matrix masked rounds)."""
    from unittest import mock

    from vispe import lie

    torch.manual_seed(0)
    a = lie.skew(torch.randn(30, 16, 16)) * torch.logspace(-3, 1, 30)[:, None, None]  # |a|_inf up to ~200
    want = torch.linalg.matrix_exp(a.double())
    for kw in (dict(normal=False), dict(normal=True), dict(bound=float(torch.linalg.matrix_norm(a, ord=2).max()))):
        torch.testing.assert_close(lie.expm(a, **kw).double(), want, rtol=0, atol=3e-5)
    with mock.patch("vispe._tracing.is_tracing", return_value=True):
        torch.testing.assert_close(lie.expm(a).double(), want, rtol=0, atol=3e-5)
    inf = a.abs().sum(-1).amax()
    plain = lie.squarings(a)
    assert plain == int(torch.ceil(torch.log2(inf / lie.SCALED_NORM))) < lie.MAX_SQUARINGS
    assert lie.squarings(a, normal=True) < plain
    assert lie.squarings(a[:3]) < plain  # small matrices alone: fewer
    assert lie.squarings(a, bound=1.0) == 0 and lie.squarings(a * 0, normal=True) == 0
    calls = []
    with mock.patch.object(torch, "matmul", wraps=torch.matmul) as mm:
        lie.expm(a, normal=True)
        calls.append(mm.call_count)
    assert calls[0] == 2 + 5 + lie.squarings(a, normal=True)  # the bound's a^2, a^4; x^2, x^3, x^4, 2 Horner


def test_liere_in_eval_without_gradients_keeps_its_cached_blocks():
    """Inference reuses the grid's cached rotations (no exponential per call), training rebuilds them."""
    from unittest import mock

    from vispe import lie

    pe = _pe(LieRE, dict(block_size=8, grid=GRID)).eval()
    qk = torch.randn(2, 1, H, 15, D)
    with torch.no_grad():
        want = rope_blocks.rotate_qk(pe, qk, GRID, method="blocks")
        with mock.patch.object(lie, "expm", wraps=lie.expm) as expm:
            got = rope_blocks.rotate_qk(pe, qk, GRID)
        assert expm.call_count == 0  # served from the cache the blocks call filled
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert pe.factors(GRID, None, torch.device("cpu")) is not None  # gradients possible: rebuilt in backward
    with torch.no_grad():
        assert pe.factors(GRID, None, torch.device("cpu")) is None


@pytest.mark.parametrize("pe", ["comrope", "string"])
def test_a_training_step_under_bfloat16_autocast_runs_the_factored_kernels_in_float32(pe):
    """The factored kernels' own autograd functions compute in float32 whatever autocast says: under
    bf16 autocast ComRoPE's backward mixed a float32 gradient with bf16 Schur coordinates and failed
    (found by ``bench/gpu_check.py --dry-run``); the gradients are finite and close to float32's."""
    from vispe.models.vit import create_vit

    torch.manual_seed(0)
    m = create_vit("vit_pico", pe=pe, embed_dim=32, depth=1, num_heads=2, img_size=(12, 16), patch_size=4,
                   num_classes=3)
    x = torch.randn(2, 3, 12, 16)
    grads = []
    for amp in (False, True):
        m.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = m(x).float().square().mean()
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for n, p in m.named_parameters() if ".attn.pe." in n]))
    assert torch.isfinite(grads[1]).all() and grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=0.1, atol=0.1 * float(grads[0].abs().max()))
