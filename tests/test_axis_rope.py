"""RoPE (vispe.axis.rope): formula, relative property, norm, layouts and their converters."""
import math

import pytest
import torch

from vispe.axis.rope import apply_rope, half_to_interleaved, interleaved_to_half, rope_angles, rope_frequencies

LAYOUTS = ["half", "interleaved"]


def ref_rope(x: list[float], m: float, base: float, layout: str) -> list[float]:
    """Rotate pair i of ``x`` by m * base^(-2i/d), pairs as the layout says, in plain Python."""
    d = len(x)
    out = list(x)
    for i in range(d // 2):
        a, b = (i, i + d // 2) if layout == "half" else (2 * i, 2 * i + 1)
        th = m * base ** (-2 * i / d)
        out[a] = x[a] * math.cos(th) - x[b] * math.sin(th)
        out[b] = x[b] * math.cos(th) + x[a] * math.sin(th)
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_matches_formula_on_3x5_positions(layout):
    g = torch.Generator().manual_seed(0)
    pos = torch.tensor([[0.0, 1.0, 2.5, -3.0, 7.0], [11.0, 0.5, 40.0, 63.0, 99.0], [5.0, 6.0, 8.0, 13.0, 2.0]])
    x = torch.randn(3, 5, 8, generator=g, dtype=torch.float64)
    out = apply_rope(x, rope_angles(pos.double(), 8, base=100.0), layout)
    for y in range(3):
        for c in range(5):
            want = ref_rope(x[y, c].tolist(), float(pos[y, c]), 100.0, layout)
            torch.testing.assert_close(out[y, c], torch.tensor(want, dtype=torch.float64), atol=1e-12, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rope_score_depends_only_on_offset(layout):
    g = torch.Generator().manual_seed(1)
    d = 16
    q = torch.randn(d, generator=g, dtype=torch.float64)
    k = torch.randn(d, generator=g, dtype=torch.float64)
    m = torch.tensor([0.0, 3.0, 10.0, 57.0, 200.0, 1.5], dtype=torch.float64)
    n = torch.tensor([0.0, 7.0, 2.0, 60.0, 13.0, 4.25], dtype=torch.float64)

    def score(mm, nn):
        rq = apply_rope(q.expand(len(mm), d), rope_angles(mm, d), layout)  # (P, d)
        rk = apply_rope(k.expand(len(nn), d), rope_angles(nn, d), layout)  # (P, d)
        return (rq * rk).sum(-1)  # (P,)

    base = score(m, n)
    for shift in (1.0, -5.0, 12.5, 1000.0):
        torch.testing.assert_close(score(m + shift, n + shift), base, atol=1e-10, rtol=0)
    # and it equals the score at (m - n, 0)
    torch.testing.assert_close(score(m - n, torch.zeros_like(n)), base, atol=1e-10, rtol=0)
    assert base.std() > 1e-3  # different offsets do give different scores


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rope_preserves_norm_and_is_identity_at_zero(layout):
    x = torch.randn(4, 6, 32, dtype=torch.float64)
    ang = rope_angles(torch.rand(4, 6, dtype=torch.float64) * 500, 32)
    torch.testing.assert_close(apply_rope(x, ang, layout).norm(dim=-1), x.norm(dim=-1), atol=1e-12, rtol=0)
    torch.testing.assert_close(apply_rope(x, torch.zeros(4, 6, 16), layout), x)


def test_layout_converters_round_trip_and_agree_with_apply_rope():
    x = torch.randn(2, 5, 12)
    assert torch.equal(interleaved_to_half(half_to_interleaved(x)), x)
    assert torch.equal(half_to_interleaved(interleaved_to_half(x)), x)
    # channel c of the half layout is channel 2c (c < d/2) or 2(c - d/2) + 1 of the interleaved one
    hi = half_to_interleaved(torch.arange(12.0))
    assert hi.tolist() == [0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11]
    ang = rope_angles(torch.arange(5.0), 12)  # (5, 6)
    torch.testing.assert_close(apply_rope(half_to_interleaved(x), ang, "interleaved"),
                               half_to_interleaved(apply_rope(x, ang, "half")))
    torch.testing.assert_close(apply_rope(interleaved_to_half(x), ang, "half"),
                               interleaved_to_half(apply_rope(x, ang, "interleaved")))


def test_rope_frequencies_and_dtypes():
    f = rope_frequencies(8, 10000.0)
    torch.testing.assert_close(f, torch.tensor([10000.0 ** (-2 * i / 8) for i in range(4)]))
    assert rope_angles(torch.arange(3), 8).dtype == torch.float32  # integer positions -> float32
    assert rope_angles(torch.arange(3.0).bfloat16(), 8).dtype == torch.float32
    x = torch.randn(3, 8).bfloat16()
    assert apply_rope(x, rope_angles(torch.arange(3.0), 8)).dtype == torch.bfloat16
