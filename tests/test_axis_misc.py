"""Every axis primitive: forward + backward without NaN in float32 and float64, float32 tables
under bf16 autocast, and a ValueError naming the argument on bad input."""
import math
import re

import pytest
import torch

from vispe.axis.alibi import AlibiBias, alibi_bias, alibi_slopes
from vispe.axis.complex_order import ComplexOrder1d, complex_order
from vispe.axis.deberta import DebertaRelative
from vispe.axis.learned import LearnedTable1d, resize_table_1d
from vispe.axis.multiplicative import Multiplicative, multiplicative
from vispe.axis.ode import ODEEncoding1d, RecurrentEncoding1d
from vispe.axis.relative import clipped_index, relative_offsets, t5_bucket
from vispe.axis.rope import apply_rope, half_to_interleaved, rope_angles, rope_frequencies
from vispe.axis.shaw import ShawRelative
from vispe.axis.sinusoidal import normalized_index, raw_index, single_sinusoid, sinusoid_frequencies, sinusoidal
from vispe.axis.t5 import T5RelativeBias
from vispe.axis.transformer_xl import TransformerXLRelative


def _leaf(*shape, dtype, scale=1.0, offset=0.0):
    g = torch.Generator().manual_seed(len(shape) + sum(shape))
    return (torch.rand(*shape, generator=g, dtype=dtype) * scale + offset).requires_grad_()


def _qk(dtype):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 6, 8, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(2, 3, 5, 8, generator=g, dtype=dtype).requires_grad_()
    return q, k


QP, KP = torch.tensor([0.0, 1.0, 2.5, 4.0, 9.0, 30.0]), torch.tensor([0.0, 2.0, 3.0, 8.0, 100.0])


def _pos(dtype):
    return QP.to(dtype), KP.to(dtype)


def _shaw(dtype):
    q, k = _qk(dtype)
    v = torch.randn(2, 3, 5, 8, dtype=dtype).requires_grad_()
    m = ShawRelative(8, 3, num_heads=3).to(dtype)
    return m(q, k, v, *_pos(dtype)), [q, k, v, *m.parameters()]


def _module(make, *, pos_scale=10.0):
    """A position module evaluated at fractional positions of a 3 x 5 tensor."""
    def run(dtype):
        m = make().to(dtype)
        pos = _leaf(3, 5, dtype=dtype, scale=pos_scale)
        return m(pos), [*m.parameters()]
    return run


def _qk_module(make):
    def run(dtype):
        m = make().to(dtype)
        q, k = _qk(dtype)
        return m(q, k, *_pos(dtype)), [q, k, *m.parameters()]
    return run


def _bias_module(make):
    def run(dtype):
        m = make().to(dtype)
        qp, kp = (p.clone().requires_grad_() for p in _pos(dtype))
        out = m(qp, kp)
        return out, [*m.parameters()] or [qp]
    return run


def _fn(f):
    def run(dtype):
        pos = _leaf(3, 5, dtype=dtype, scale=50.0)
        return f(pos), [pos]
    return run


# name -> run(dtype) -> (output, leaves that must receive a finite gradient)
PRIMITIVES = {
    "raw_index": _fn(raw_index),
    "normalized_index": _fn(lambda p: normalized_index(p, 51)),
    "single_sinusoid": _fn(lambda p: single_sinusoid(p, 0.5, 0.1)),
    "sinusoidal_concat": _fn(lambda p: sinusoidal(p, 16)),
    "sinusoidal_interleaved": _fn(lambda p: sinusoidal(p, 16, layout="interleaved")),
    "rope_half": lambda dt: (lambda x, p: (apply_rope(x, rope_angles(p, 8)), [x, p]))(
        _leaf(3, 5, 8, dtype=dt), _leaf(3, 5, dtype=dt, scale=50.0)),
    "rope_interleaved": lambda dt: (lambda x, p: (apply_rope(x, rope_angles(p, 8), "interleaved"), [x, p]))(
        _leaf(3, 5, 8, dtype=dt), _leaf(3, 5, dtype=dt, scale=50.0)),
    "resize_table_1d": lambda dt: (lambda t: (resize_table_1d(t, 13, "bicubic"), [t]))(_leaf(5, 4, dtype=dt)),
    "learned_table": _module(lambda: LearnedTable1d(12, 6)),
    "learned_table_overflow": _module(lambda: LearnedTable1d(4, 6), pos_scale=10.0),  # past the 4 rows
    "complex_order": _module(lambda: ComplexOrder1d(6)),
    "ode_euler": _module(lambda: ODEEncoding1d(6, 8, method="euler", step=0.25)),
    "ode_rk4": _module(lambda: ODEEncoding1d(6, 8, method="rk4", step=0.25)),
    "recurrent": _module(lambda: RecurrentEncoding1d(6, 8)),
    "multiplicative": lambda dt: (lambda x, m: (m(x, torch.arange(5.0, dtype=dt)), [x, *m.parameters()]))(
        _leaf(3, 5, 6, dtype=dt), Multiplicative(LearnedTable1d(5, 6), "one_plus").to(dt)),
    "multiplicative_sinusoid": lambda dt: (lambda x, p: (multiplicative(x, sinusoidal(p, 6)), [x]))(
        _leaf(3, 5, 6, dtype=dt), torch.arange(5.0, dtype=dt)),
    "shaw": _shaw,
    "t5": _bias_module(lambda: T5RelativeBias(3, num_buckets=16, max_distance=32)),
    "t5_unidirectional": _bias_module(lambda: T5RelativeBias(3, bidirectional=False)),
    "transformer_xl": _qk_module(lambda: TransformerXLRelative(3, 8)),
    "deberta": _qk_module(lambda: DebertaRelative(3, 8, 4)),
    "alibi": _bias_module(lambda: AlibiBias(5)),
    "alibi_causal": _bias_module(lambda: AlibiBias(6, causal=True)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(PRIMITIVES))
def test_forward_backward_no_nan(name, dtype):
    out, leaves = PRIMITIVES[name](dtype)
    assert out.dtype == dtype
    assert not torch.isnan(out).any()
    finite = torch.isfinite(out)
    assert finite.any() and (finite | (out == float("-inf"))).all()  # -inf only as ALiBi's causal mask
    weights = torch.linspace(-1, 1, out.numel(), dtype=dtype).view(out.shape)
    (out.masked_fill(~finite, 0) * weights).sum().backward()
    assert leaves
    for t in leaves:
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert any(t.grad.abs().sum() > 0 for t in leaves)


# --- float32 under bf16 autocast -----------------------------------------------------------------

POS_1000 = torch.linspace(0, 1000, 257)


def test_sinusoidal_stays_float32_accurate_under_autocast():
    ref = sinusoidal(POS_1000.double(), 64)
    plain = sinusoidal(POS_1000, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = sinusoidal(POS_1000, 64)
        auto_bf16_pos = sinusoidal(POS_1000.bfloat16(), 64)
    assert auto.dtype == torch.float32
    assert torch.equal(auto, plain)
    assert (auto.double() - ref).abs().max() < 2e-4  # bf16 angles would be off by whole radians
    # bf16 positions are themselves rounded (to multiples of 4 near 1000): the code of the rounded positions
    torch.testing.assert_close(auto_bf16_pos, sinusoidal(POS_1000.bfloat16().float(), 64))


def test_rope_angles_and_rotation_stay_float32_accurate_under_autocast():
    ref = rope_angles(POS_1000.double(), 64)
    x = torch.randn(257, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ang = rope_angles(POS_1000, 64)
        rot = apply_rope(x, ang)
        rot_bf16 = apply_rope(x.bfloat16(), ang)
    assert ang.dtype == torch.float32 and rot.dtype == torch.float32 and rot_bf16.dtype == torch.bfloat16
    assert ((ang.double() - ref).abs() / ref.abs().clamp(min=1)).max() < 1e-6
    ref_rot = apply_rope(x.double(), ref)
    assert (rot.double() - ref_rot).abs().max() < 1e-3
    # bf16 in, bf16 out: equal to the float32 rotation of the bf16 input, rounded once
    torch.testing.assert_close(rot_bf16, apply_rope(x.bfloat16().float(), ang).bfloat16(), atol=0, rtol=0)


def test_other_fixed_codes_stay_float32_under_autocast():
    c = ComplexOrder1d(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        code = c(POS_1000)
        bias = AlibiBias(4)(POS_1000, POS_1000)
        ode = ODEEncoding1d(4, 8)(torch.tensor([0.0, 3.5, 20.0]))
    assert code.dtype == bias.dtype == ode.dtype == torch.float32
    torch.testing.assert_close(code, c(POS_1000))
    torch.testing.assert_close(bias, AlibiBias(4)(POS_1000, POS_1000))


# --- bad input -----------------------------------------------------------------------------------

P, X8 = torch.arange(5.0), torch.randn(5, 8)
BAD = [
    ("dim=0", lambda: sinusoidal(P, 0)),
    ("dim=-4", lambda: sinusoidal(P, -4)),
    ("dim=7", lambda: sinusoidal(P, 7)),
    ("layout='diagonal'", lambda: sinusoidal(P, 8, layout="diagonal")),
    ("temperature=0", lambda: sinusoid_frequencies(8, 0.0)),
    ("length=0", lambda: normalized_index(P, 0)),
    ("dim=5", lambda: rope_frequencies(5)),
    ("dim=-2", lambda: rope_angles(P, -2)),
    ("base=-1", lambda: rope_frequencies(8, -1.0)),
    ("angles", lambda: apply_rope(X8, torch.zeros(5, 3))),
    ("x has shape", lambda: apply_rope(torch.randn(5, 7), torch.zeros(5, 3))),
    ("x has shape", lambda: half_to_interleaved(torch.randn(5, 7))),
    ("layout='pairs'", lambda: apply_rope(X8, torch.zeros(5, 4), "pairs")),
    ("length=0", lambda: resize_table_1d(X8, 0)),
    ("mode='area'", lambda: resize_table_1d(X8, 3, "area")),
    ("table has shape", lambda: resize_table_1d(torch.randn(5), 3)),
    ("length=0", lambda: LearnedTable1d(0, 4)),
    ("dim=-1", lambda: LearnedTable1d(4, -1)),
    ("overflow='clip'", lambda: LearnedTable1d(4, 2, overflow="clip")),
    ("pos", lambda: LearnedTable1d(4, 2)(torch.tensor([-1]))),
    ("dim=0", lambda: ComplexOrder1d(0)),
    ("output='complex'", lambda: ComplexOrder1d(4, output="complex")),
    ("frequency", lambda: complex_order(P, torch.ones(4), torch.ones(3), torch.zeros(4))),
    ("dim=0", lambda: ODEEncoding1d(0)),
    ("hidden=0", lambda: RecurrentEncoding1d(8, hidden=0)),
    ("step=0", lambda: ODEEncoding1d(4, step=0)),
    ("delta_t=-1", lambda: ODEEncoding1d(4, delta_t=-1.0)),
    ("method='midpoint'", lambda: ODEEncoding1d(4, method="midpoint")),
    ("pos", lambda: ODEEncoding1d(4)(torch.tensor([-2.0]))),
    ("pos", lambda: RecurrentEncoding1d(4)(torch.tensor([-2.0]))),
    ("pe", lambda: multiplicative(X8, torch.randn(4, 8))),
    ("combine='sum'", lambda: multiplicative(X8, X8, "sum")),
    ("code", lambda: Multiplicative(3)),
    ("max_distance=0", lambda: clipped_index(P, 0)),
    ("max_distance=0", lambda: t5_bucket(P, max_distance=0)),
    ("max_distance=8", lambda: t5_bucket(P, num_buckets=32, max_distance=8)),
    ("num_buckets=2", lambda: t5_bucket(P, num_buckets=2)),
    ("k_pos", lambda: relative_offsets(torch.zeros(2, 3), torch.zeros(4, 5))),
    ("q_pos", lambda: relative_offsets(torch.tensor(1.0), P)),
    ("head_dim=0", lambda: ShawRelative(0, 3)),
    ("max_distance=0", lambda: ShawRelative(8, 0)),
    ("max_distance=-1", lambda: ShawRelative(8, -1)),
    ("num_heads=0", lambda: ShawRelative(8, 2, num_heads=0)),
    ("use_key=False", lambda: ShawRelative(8, 2, use_key=False, use_value=False)),
    ("q_pos", lambda: ShawRelative(8, 2).logits(*_qk(torch.float32), QP[:4], KP)),
    ("k has shape", lambda: ShawRelative(8, 2).logits(_qk(torch.float32)[0], torch.randn(2, 3, 5, 4), QP, KP)),
    ("table_k", lambda: ShawRelative(8, 2, num_heads=2).logits(*_qk(torch.float32), QP, KP)),
    ("num_heads=0", lambda: T5RelativeBias(0)),
    ("max_distance=0", lambda: T5RelativeBias(2, max_distance=0)),
    ("max_distance=4", lambda: T5RelativeBias(2, max_distance=4)),
    ("rel_dim=7", lambda: TransformerXLRelative(2, 8, rel_dim=7)),
    ("num_heads=0", lambda: TransformerXLRelative(0, 8)),
    ("q has shape", lambda: TransformerXLRelative(2, 8)(*_qk(torch.float32), QP, KP)),
    ("k_pos", lambda: TransformerXLRelative(3, 8)(*_qk(torch.float32), QP, KP[:3])),
    ("max_distance=0", lambda: DebertaRelative(2, 8, 0)),
    ("head_dim=-8", lambda: DebertaRelative(2, -8, 3)),
    ("position_terms", lambda: DebertaRelative(2, 8, 3, position_terms=("c2c",))),
    ("position_terms", lambda: DebertaRelative(2, 8, 3, position_terms=())),
    ("k_pos", lambda: DebertaRelative(3, 8, 3)(*_qk(torch.float32), QP, KP[:2])),
    ("num_heads=0", lambda: AlibiBias(0)),
    ("num_heads=0", lambda: alibi_slopes(0)),
    ("q_pos", lambda: alibi_bias(torch.tensor(1.0), KP, alibi_slopes(2))),
]


@pytest.mark.parametrize("match,call", BAD, ids=[f"{i}-{m}" for i, (m, _) in enumerate(BAD)])
def test_bad_input_raises_value_error_naming_the_argument(match, call):
    with pytest.raises(ValueError, match=re.escape(match)):
        call()


def test_learned_tables_are_the_only_state():
    assert "slopes" not in AlibiBias(4).state_dict()
    assert set(T5RelativeBias(2).state_dict()) == {"weight"}
    assert set(ComplexOrder1d(3).state_dict()) == {"amplitude", "frequency", "phase"}
    assert math.isclose(float(alibi_slopes(2)[0]), 2 ** -4)
