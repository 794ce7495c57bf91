"""Absolute 1D axis primitives: sinusoids, learned tables, complex-order, ODE/recurrent, product.

Every check is against an independent reference written here or a property of the scheme.
"""
import math

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from vispe.axis.complex_order import ComplexOrder1d, complex_order
from vispe.axis.learned import LearnedTable1d, interpolate_rows, resize_table_1d
from vispe.axis.multiplicative import Multiplicative, multiplicative
from vispe.axis.ode import ODEEncoding1d, RecurrentEncoding1d
from vispe.axis.sinusoidal import normalized_index, raw_index, single_sinusoid, sinusoidal

# Positions of a non-square 3 x 5 tensor, fractional and negative ones included.
POS = torch.tensor([[0.0, 1.0, 2.5, -3.25, 7.0], [11.0, 0.125, 40.0, 63.5, 99.0], [5.0, 6.0, 8.75, 13.0, 2.0]])


def ref_sinusoidal(p: float, dim: int, temperature: float, layout: str) -> list[float]:
    """Vaswani et al.: PE[2i] = sin(p / T^(2i/d)), PE[2i+1] = cos(...), in plain Python."""
    sins = [math.sin(p / temperature ** (2 * i / dim)) for i in range(dim // 2)]
    coss = [math.cos(p / temperature ** (2 * i / dim)) for i in range(dim // 2)]
    if layout == "concat":
        return sins + coss
    return [v for pair in zip(sins, coss) for v in pair]


# --- sinusoids -----------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["concat", "interleaved"])
@pytest.mark.parametrize("temperature", [10000.0, 100.0])
def test_sinusoidal_matches_formula_element_by_element(layout, temperature):
    dim = 12
    out = sinusoidal(POS, dim, temperature, layout)
    assert out.shape == (3, 5, dim) and out.dtype == torch.float32
    for y in range(3):
        for x in range(5):
            want = torch.tensor(ref_sinusoidal(float(POS[y, x]), dim, temperature, layout), dtype=torch.float32)
            torch.testing.assert_close(out[y, x], want, atol=2e-5, rtol=0)


def test_sinusoidal_float64_positions_give_float64_codes():
    out = sinusoidal(POS.double(), 8)
    assert out.dtype == torch.float64
    want = torch.tensor([ref_sinusoidal(float(p), 8, 10000.0, "concat") for p in POS.flatten()], dtype=torch.float64)
    torch.testing.assert_close(out.reshape(-1, 8), want, atol=1e-12, rtol=0)


def test_sinusoidal_is_bounded():
    pos = torch.rand(1000, generator=torch.Generator().manual_seed(0)) * 2e4 - 1e4
    out = sinusoidal(pos, 64)
    assert out.abs().max() <= 1.0


def test_sinusoidal_distinct_positions_give_distinct_codes():
    codes = sinusoidal(torch.arange(512.0), 32)  # (512, 32)
    dist = torch.cdist(codes.double(), codes.double())
    dist.fill_diagonal_(float("inf"))
    assert dist.min() > 0.5


def test_sinusoidal_dot_product_depends_only_on_offset():
    ks = torch.arange(0, 64, dtype=torch.float64)
    dots = []
    for p in (0.0, 3.5, 17.0, 250.0):
        a = sinusoidal(torch.full_like(ks, p), 64)  # (K, 64)
        b = sinusoidal(p + ks, 64)  # (K, 64)
        dots.append((a * b).sum(-1))
    for d in dots[1:]:
        torch.testing.assert_close(d, dots[0], atol=1e-10, rtol=0)


def test_sinusoidal_remote_decay():
    codes = sinusoidal(torch.arange(512, dtype=torch.float64), 128)
    dot = codes[0] @ codes.T  # (512,) dot at offset k
    assert all(dot[k] > dot[2 * k] for k in range(1, 65))
    assert spearmanr(np.arange(512), dot.numpy()).correlation < -0.8


def test_raw_normalized_single_sinusoid_formulas():
    torch.testing.assert_close(raw_index(POS), POS[..., None])
    t = torch.arange(5.0)
    torch.testing.assert_close(normalized_index(t, 5)[..., 0], torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]))
    assert normalized_index(torch.zeros(1), 1).item() == 0.0
    want = torch.tensor([[math.sin(0.3 * float(p) + 0.7) for p in row] for row in POS])
    torch.testing.assert_close(single_sinusoid(POS, 0.3, 0.7)[..., 0], want, atol=5e-6, rtol=0)


# --- learned tables ------------------------------------------------------------------------------

def test_resize_to_same_length_is_identity():
    table = torch.randn(7, 4)
    assert torch.equal(resize_table_1d(table, 7), table)
    m = LearnedTable1d(7, 4)
    assert torch.equal(m(torch.arange(7), 7), m.weight)


@pytest.mark.parametrize("mode", ["linear", "bicubic", "nearest"])
def test_resize_longer_is_finite_and_continuous(mode):
    table = torch.randn(8, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = resize_table_1d(table, 29, mode)
    assert out.shape == (29, 3) and torch.isfinite(out).all()
    step_in = (table[1:] - table[:-1]).abs().max()
    step_out = (out[1:] - out[:-1]).abs().max()
    assert step_out <= step_in * (1.3 if mode == "bicubic" else 1.0) + 1e-12  # neighbours stay close
    tol = 0.25 * step_in if mode == "bicubic" else 1e-12
    assert (out[0] - table[0]).abs().max() <= tol and (out[-1] - table[-1]).abs().max() <= tol


def test_resize_linear_matches_half_pixel_reference():
    table = torch.randn(6, 2, dtype=torch.float64)
    n = 15
    src = np.clip((np.arange(n) + 0.5) * 6 / n - 0.5, 0, 5)  # half-pixel centres (align_corners=False)
    want = np.stack([np.interp(src, np.arange(6), table[:, c].numpy()) for c in range(2)], -1)
    np.testing.assert_allclose(resize_table_1d(table, n).numpy(), want, atol=1e-6)


def test_resize_shorter_keeps_a_constant_table_constant():
    out = resize_table_1d(torch.full((40, 3), 2.5), 7)  # antialiased downsampling
    torch.testing.assert_close(out, torch.full((7, 3), 2.5))


def test_learned_table_overflow_error_names_the_length():
    m = LearnedTable1d(16, 4, overflow="error")
    with pytest.raises(ValueError, match="length=16"):
        m(torch.arange(20))
    with pytest.raises(ValueError, match="length=20"):
        m.table(20)


def test_learned_table_overflow_interpolate_resizes_to_cover():
    m = LearnedTable1d(8, 3, overflow="interpolate")
    pos = torch.arange(12)
    torch.testing.assert_close(m(pos), resize_table_1d(m.weight, 12)[pos])


def test_learned_table_fractional_positions_interpolate_linearly():
    m = LearnedTable1d(5, 3)
    out = m(torch.tensor([2.25, 4.0]))
    torch.testing.assert_close(out[0], 0.75 * m.weight[2] + 0.25 * m.weight[3])
    torch.testing.assert_close(out[1], m.weight[4])
    with pytest.raises(ValueError, match="pos"):
        interpolate_rows(m.weight, torch.tensor([-1.0]))


# --- complex order -------------------------------------------------------------------------------

def test_complex_order_matches_formula_and_output_forms():
    g = torch.Generator().manual_seed(2)
    r, w, th = torch.rand(4, generator=g) + 0.5, torch.rand(4, generator=g), torch.randn(4, generator=g)
    out = complex_order(POS, r, w, th)  # (3, 5, 8)
    real, imag = complex_order(POS, r, w, th, output="pair")
    for y in range(3):
        for x in range(5):
            p = float(POS[y, x])
            want_re = [float(r[k]) * math.cos(float(w[k]) * p + float(th[k])) for k in range(4)]
            want_im = [float(r[k]) * math.sin(float(w[k]) * p + float(th[k])) for k in range(4)]
            torch.testing.assert_close(out[y, x], torch.tensor(want_re + want_im), atol=2e-5, rtol=0)
    torch.testing.assert_close(torch.cat([real, imag], -1), out)


def test_complex_order_shift_is_a_rotation_and_init_is_sinusoidal():
    m = ComplexOrder1d(6)
    with torch.no_grad():
        m.phase.normal_()
        m.amplitude.uniform_(0.5, 2.0)
    p, delta = torch.arange(10, dtype=torch.float64), 3.75
    re0, im0 = complex_order(p, m.amplitude, m.frequency, m.phase, output="pair")
    re1, im1 = complex_order(p + delta, m.amplitude, m.frequency, m.phase, output="pair")
    c, s = torch.cos(m.frequency.double() * delta), torch.sin(m.frequency.double() * delta)
    torch.testing.assert_close(re1, re0 * c - im0 * s)  # f(p + delta) = f(p) e^{i w delta}
    torch.testing.assert_close(im1, re0 * s + im0 * c)
    fresh = ComplexOrder1d(6)(p)  # r = 1, theta = 0, w = Vaswani's frequencies of a 12-dim code
    ref = torch.tensor([ref_sinusoidal(float(q), 12, 10000.0, "concat") for q in p], dtype=torch.float64)
    torch.testing.assert_close(fresh.double(), torch.cat([ref[:, 6:], ref[:, :6]], -1), atol=1e-6, rtol=0)


# --- ODE / recurrent (FLOATER) -------------------------------------------------------------------

class Decay(torch.nn.Module):
    def forward(self, t, p):  # dp/dt = -p  ->  p(t) = p0 e^{-t}
        return -p


class Cosine(torch.nn.Module):
    def forward(self, t, p):  # dp/dt = cos(t)  ->  p(t) = p0 + sin(t)
        return torch.cos(t).expand_as(p)


@pytest.mark.parametrize("field,exact", [(Decay(), lambda p0, t: p0 * torch.exp(-t)),
                                         (Cosine(), lambda p0, t: p0 + torch.sin(t))])
def test_ode_integrators_match_analytic_solutions_at_fractional_positions(field, exact):
    pos = torch.tensor([[0.0, 1.0, 2.37], [5.5, 9.99, 12.0]], dtype=torch.float64)
    errors = {}
    for method in ("euler", "rk4"):
        m = ODEEncoding1d(3, delta_t=0.25, step=0.1, method=method, field=field).double()
        got = m(pos)  # (2, 3, 3)
        want = exact(m.p0.detach(), pos[..., None] * 0.25)
        errors[method] = (got - want).abs().max().item()
    assert errors["rk4"] < 1e-6
    assert errors["rk4"] * 100 < errors["euler"] < 0.2  # Euler: global error O(step), step = 0.1


def test_ode_default_field_is_consistent_and_continuous():
    m = ODEEncoding1d(8, hidden=16).double()
    alone = m(torch.tensor([1.3], dtype=torch.float64))
    with_more = m(torch.tensor([1.3, 40.0], dtype=torch.float64))
    torch.testing.assert_close(alone[0], with_more[0])  # the integration grid does not change it
    near = m(torch.tensor([3.0, 3.0 + 1e-6], dtype=torch.float64))
    assert (near[0] - near[1]).abs().max() < 1e-5
    grid = m.grid_states(4)  # step 0.1 = delta_t: grid point k is position k
    torch.testing.assert_close(m(torch.arange(5, dtype=torch.float64)), grid)
    with pytest.raises(ValueError, match="pos"):
        m(torch.tensor([-1.0]))


def test_recurrent_encoding_follows_its_recurrence():
    m = RecurrentEncoding1d(6, hidden=8)
    out = m(torch.arange(5))  # (5, 6)
    torch.testing.assert_close(out[0], m.p0)
    for k in range(4):
        torch.testing.assert_close(out[k + 1], m.f(out[k]))
    half = m(torch.tensor([2.5]))[0]
    torch.testing.assert_close(half, 0.5 * (out[2] + out[3]))


# --- multiplicative ------------------------------------------------------------------------------

def test_multiplicative_product_and_one_plus():
    x, pe = torch.randn(3, 5, 8), torch.randn(5, 8)
    torch.testing.assert_close(multiplicative(x, pe), x * pe)
    torch.testing.assert_close(multiplicative(x, pe, "one_plus"), x * (1 + pe))
    torch.testing.assert_close(multiplicative(x, torch.zeros(5, 8), "one_plus"), x)  # identity at p = 0
    with pytest.raises(ValueError, match="pe"):
        multiplicative(x, torch.randn(4, 8))


def test_multiplicative_module_wraps_a_learned_code_and_trains_it():
    table = LearnedTable1d(5, 8)
    m = Multiplicative(table)
    x, pos = torch.randn(2, 5, 8), torch.arange(5)
    out = m(x, pos)
    torch.testing.assert_close(out, x * table.weight)
    out.sum().backward()
    assert table.weight.grad is not None and torch.isfinite(table.weight.grad).all()
    assert any(p is table.weight for p in m.parameters())
