"""Relative 1D schemes: index functions, Shaw, T5, Transformer-XL, DeBERTa, ALiBi.

References are written here (loops over pairs, the Mesh-TensorFlow bucket formula in numpy) or
published values; every score is checked to be translation invariant.
"""
import math

import numpy as np
import pytest
import torch

from vispe.axis.alibi import AlibiBias, alibi_slopes
from vispe.axis.deberta import DebertaRelative
from vispe.axis.relative import clipped_index, relative_offsets, t5_bucket
from vispe.axis.shaw import ShawRelative
from vispe.axis.t5 import T5RelativeBias
from vispe.axis.transformer_xl import TransformerXLRelative

G = torch.Generator().manual_seed(0)
QP = torch.tensor([0.0, 3.0, 4.0, 9.0, 30.0, 31.0])  # 6 queries, irregular positions
KP = torch.tensor([1.0, 2.0, 8.0, 15.0, 140.0])  # 5 keys


def qkv(b=2, h=3, nq=6, nk=5, d=8, dtype=torch.float64):
    return (torch.randn(b, h, nq, d, generator=G, dtype=dtype), torch.randn(b, h, nk, d, generator=G, dtype=dtype),
            torch.randn(b, h, nk, d, generator=G, dtype=dtype))


def test_relative_offsets_are_key_minus_query():
    off = relative_offsets(QP, KP)
    assert off.shape == (6, 5)
    for i in range(6):
        for j in range(5):
            assert off[i, j] == KP[j] - QP[i]


def test_clipped_index_clips_to_k():
    off = torch.arange(-10, 11)
    idx = clipped_index(off, 3)
    assert idx.tolist() == [min(max(o, -3), 3) + 3 for o in range(-10, 11)]
    assert idx.min() == 0 and idx.max() == 6  # beyond +-k -> end entries


# --- T5 buckets ----------------------------------------------------------------------------------

def mtf_bucket(rel: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
    """Mesh TensorFlow's ``_relative_position_bucket`` (transformer_layers.py), in numpy float32."""
    ret = np.zeros_like(rel)
    n = -rel
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(rel.dtype) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) on the small ones, discarded
        log_ratio = np.log(n.astype(np.float32) / np.float32(max_exact))
        val = max_exact + (log_ratio / np.float32(math.log(max_distance / max_exact))
                           * (num_buckets - max_exact)).astype(rel.dtype)
    val = np.minimum(val, num_buckets - 1)
    return ret + np.where(is_small, n, val)


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance",
                         [(True, 32, 128), (False, 32, 128), (True, 64, 256), (False, 16, 40), (True, 15, 4)])
def test_t5_bucket_matches_mesh_tensorflow(bidirectional, num_buckets, max_distance):
    rel = np.arange(-400, 401, dtype=np.int64)
    want = mtf_bucket(rel, bidirectional, num_buckets, max_distance)
    got = t5_bucket(torch.from_numpy(rel), bidirectional=bidirectional, num_buckets=num_buckets,
                    max_distance=max_distance)
    np.testing.assert_array_equal(got.numpy(), want)


# Published test vectors of Google Research's ``get_relative_position_bucket`` (embeddings_test).
REL = torch.tensor([[-10, -9, -8, -7, -6], [-5, -4, -3, -2, -1], [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]])
KNOWN = [
    (False, 4, 3, [[3, 3, 3, 3, 3], [3, 3, 3, 2, 1], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]),
    (False, 8, 10, [[7, 7, 7, 6, 5], [4, 4, 3, 2, 1], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]),
    (False, 16, 9, [[15, 15, 8, 7, 6], [5, 4, 3, 2, 1], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]),
    (True, 4, 4, [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 3, 3, 3, 3], [3, 3, 3, 3, 3]]),
    (True, 15, 4, [[6, 6, 6, 6, 6], [6, 6, 3, 2, 1], [0, 8, 9, 10, 13], [13, 13, 13, 13, 13]]),
    (True, 16, 8, [[7, 7, 7, 7, 6], [5, 4, 3, 2, 1], [0, 9, 10, 11, 12], [13, 14, 15, 15, 15]]),
]


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance,want", KNOWN)
def test_t5_bucket_known_values(bidirectional, num_buckets, max_distance, want):
    got = t5_bucket(REL, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    assert got.tolist() == want


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bucket_monotone_exact_then_logarithmic(bidirectional):
    nb, md = 32, 128
    n = torch.arange(0, 1000)
    b = t5_bucket(-n, bidirectional=bidirectional, num_buckets=nb, max_distance=md)  # keys before the query
    half = nb // 2 if bidirectional else nb
    exact = half // 2
    assert (b[1:] >= b[:-1]).all()  # monotone in distance
    assert b[:exact].tolist() == list(range(exact))  # exact for small distances
    assert (b[md:] == half - 1).all()  # T5: every distance from max_distance on shares the last bucket
    # logarithmic: bucket v starts at the first integer past exact * (md / exact)^((v - exact) / (half - exact))
    starts = np.array([int((b == v).nonzero()[0]) for v in range(exact, half)])
    geometric = exact * (md / exact) ** ((np.arange(exact, half) - exact) / (half - exact))
    assert np.all((starts - geometric >= -1e-6) & (starts - geometric < 1))
    if bidirectional:  # keys after the query use the upper half, mirrored
        after = t5_bucket(n, bidirectional=True, num_buckets=nb, max_distance=md)
        assert (after[1:] == b[1:] + half).all() and after[0] == 0


# --- Shaw et al. ---------------------------------------------------------------------------------

def ref_shaw(q, k, v, qp, kp, tk, tv, kmax):
    """Shaw et al. eq. (3)-(5), pair by pair; tables (R, d) shared or (H, R, d)."""
    b, h, nq, d = q.shape
    out = torch.zeros(b, h, nq, v.shape[-1], dtype=q.dtype)
    logits = torch.zeros(b, h, nq, k.shape[-2], dtype=q.dtype)
    for bb in range(b):
        for hh in range(h):
            ak = tk if tk.dim() == 2 else tk[hh]
            av = tv if tv.dim() == 2 else tv[hh]
            for i in range(nq):
                idx = [min(max(int(kp[j] - qp[i]), -kmax), kmax) + kmax for j in range(k.shape[-2])]
                e = torch.stack([q[bb, hh, i] @ (k[bb, hh, j] + ak[idx[j]]) for j in range(len(idx))]) / math.sqrt(d)
                logits[bb, hh, i] = e
                a = e.softmax(-1)
                out[bb, hh, i] = sum(a[j] * (v[bb, hh, j] + av[idx[j]]) for j in range(len(idx)))
    return logits, out


@pytest.mark.parametrize("num_heads", [None, 3])
def test_shaw_matches_pairwise_reference(num_heads):
    q, k, v = qkv()
    m = ShawRelative(8, 4, num_heads=num_heads, init_std=1.0).double()
    logits, out = ref_shaw(q, k, v, QP, KP, m.table_k, m.table_v, 4)
    torch.testing.assert_close(m.logits(q, k, QP, KP), logits)
    torch.testing.assert_close(m(q, k, v, QP, KP), out)
    far = m.key_term(q, QP, KP)[..., 4]  # key at 140: offsets > 4 -> last entry a^K_{2k}
    tk = m.table_k if num_heads is None else m.table_k[:, None]
    torch.testing.assert_close(far, (q * tk[..., 8, :]).sum(-1))


def test_shaw_per_batch_positions():
    q, k, v = qkv()
    m = ShawRelative(8, 2, num_heads=3).double()
    qp = torch.stack([QP, QP + 1.0])  # (B, Nq): second image shifted
    kp = torch.stack([KP, KP - 2.0])
    out = m(q, k, v, qp, kp)
    torch.testing.assert_close(out[1:], m(q[1:], k[1:], v[1:], qp[1], kp[1]))


# --- translation invariance of every relative score ---------------------------------------------

def _scores():
    q, k, _ = qkv()
    shaw = ShawRelative(8, 4, num_heads=3).double()
    t5 = T5RelativeBias(3, num_buckets=16, max_distance=20, init_std=1.0).double()
    t5u = T5RelativeBias(3, num_buckets=16, max_distance=20, bidirectional=False, init_std=1.0).double()
    txl = TransformerXLRelative(3, 8, init_std=1.0).double()
    deb = DebertaRelative(3, 8, 4, init_std=1.0).double()
    return {
        "shaw": lambda qp, kp: shaw.logits(q, k, qp, kp),
        "t5": lambda qp, kp: t5(qp, kp),
        "t5_unidirectional": lambda qp, kp: t5u(qp, kp),
        "transformer_xl": lambda qp, kp: txl(q, k, qp, kp),
        "deberta": lambda qp, kp: deb(q, k, qp, kp),
        "alibi": lambda qp, kp: AlibiBias(3)(qp, kp),
        "alibi_causal": lambda qp, kp: AlibiBias(3, causal=True)(qp, kp),
    }


@pytest.mark.parametrize("name", list(_scores()))
def test_relative_scores_are_translation_invariant(name):
    fn = _scores()[name]
    qp, kp = QP.double(), KP.double()
    base = fn(qp, kp)
    assert torch.isfinite(base).any()
    for shift in (1.0, 17.0, -250.0):
        torch.testing.assert_close(fn(qp + shift, kp + shift), base, atol=1e-9, rtol=0)
    moved = fn(qp, kp + 1.0)  # moving only the keys changes the score
    assert not torch.allclose(moved, base)


# --- T5 module -----------------------------------------------------------------------------------

def test_t5_bias_reads_its_table_at_the_buckets():
    m = T5RelativeBias(4, init_std=1.0)
    bias = m(QP, KP)  # (4, 6, 5)
    for i in range(6):
        for j in range(5):
            b = t5_bucket(torch.tensor(int(KP[j] - QP[i])))
            torch.testing.assert_close(bias[:, i, j], m.weight[b])


# --- Transformer-XL ------------------------------------------------------------------------------

def ref_sin_code(delta: float, dim: int) -> torch.Tensor:
    f = [10000.0 ** (-2 * i / dim) for i in range(dim // 2)]
    return torch.tensor([math.sin(delta * w) for w in f] + [math.cos(delta * w) for w in f], dtype=torch.float64)


def test_transformer_xl_terms_match_the_formula():
    q, k, _ = qkv(b=1)
    m = TransformerXLRelative(3, 8, rel_dim=6, init_std=1.0).double()
    terms = m.terms(q, k, QP.double(), KP.double())
    w = m.w_kr.weight.view(3, 8, 6)  # (H, d, rel_dim)
    for h in range(3):
        for i in range(6):
            for j in range(5):
                wr = w[h] @ ref_sin_code(float(QP[i] - KP[j]), 6)  # W_{k,R} R_{i-j}
                qi, kj = q[0, h, i], k[0, h, j]
                want = [qi @ kj, qi @ wr, m.u[h] @ kj, m.v[h] @ wr]
                got = [terms["a"][0, h, i, j], terms["b"][0, h, i, j], terms["c"][0, h, 0, j], terms["d"][h, i, j]]
                torch.testing.assert_close(torch.stack(got), torch.stack(want))
    torch.testing.assert_close(m(q, k, QP.double(), KP.double()), terms["a"] + terms["b"] + terms["c"] + terms["d"])


# --- DeBERTa -------------------------------------------------------------------------------------

def paper_delta(i: int, j: int, k: int) -> int:
    if i - j <= -k:
        return 0
    if i - j >= k:
        return 2 * k - 1
    return i - j + k


def test_deberta_matches_the_paper_formula():
    q, k, _ = qkv(b=1)
    kmax = 4
    m = DebertaRelative(3, 8, kmax, p2c_convention="paper", init_std=1.0).double()
    qr = m.w_qr(m.rel_embed).view(2 * kmax, 3, 8)
    kr = m.w_kr(m.rel_embed).view(2 * kmax, 3, 8)
    got = m(q, k, QP, KP)
    for h in range(3):
        for i in range(6):
            for j in range(5):
                pi, pj = int(QP[i]), int(KP[j])
                a = (q[0, h, i] @ k[0, h, j] + q[0, h, i] @ kr[paper_delta(pi, pj, kmax), h]
                     + k[0, h, j] @ qr[paper_delta(pj, pi, kmax), h])
                torch.testing.assert_close(got[0, h, i, j], a / math.sqrt(3 * 8))
    code = DebertaRelative(3, 8, kmax, init_std=1.0).double()
    code.load_state_dict(m.state_dict())
    assert not torch.allclose(code(q, k, QP, KP), got)  # the default (code) convention differs from the paper's
    only_c2p = DebertaRelative(3, 8, kmax, position_terms=("c2p",))
    assert only_c2p.w_qr is None and set(only_c2p.terms(q.float(), k.float(), QP, KP)) == {"c2c", "c2p"}
    assert only_c2p.scale == pytest.approx(1 / math.sqrt(2 * 8))


def hf_p2c_reference(k, qr, n, kmax):
    """A faithful copy of the original code / HF transformers' position-to-content term: the
    (key x 2k) scores gathered at clamp(-(i - j) + k) on the key's rows, then transposed."""
    rel = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # (N, N), i - j (build_relative_position)
    p2c_pos = torch.clamp(-rel + kmax, 0, 2 * kmax - 1)  # (N, N)
    p2c_att = torch.matmul(k, qr.transpose(-1, -2))  # (B, H, Nk, 2k)
    return torch.gather(p2c_att, -1, p2c_pos.expand(k.shape[0], k.shape[1], n, n)).transpose(-1, -2)


def test_deberta_code_convention_matches_transformers():
    """The default p2c convention is what pretrained DeBERTa weights need: checked against a copy of
    the reference formula and against transformers' own DisentangledSelfAttention."""
    from transformers import DebertaConfig
    from transformers.models.deberta.modeling_deberta import DisentangledSelfAttention, build_relative_position

    torch.manual_seed(0)
    kmax, n, H, d = 4, 6, 3, 8
    m = DebertaRelative(H, d, kmax, init_std=1.0).double()
    with torch.no_grad():
        m.w_kr.bias.zero_()  # DeBERTa's pos_proj has no bias
    q, k = torch.randn(2, H, n, d, dtype=torch.float64), torch.randn(2, H, n, d, dtype=torch.float64)
    pos = torch.arange(n)
    qr = m.w_qr(m.rel_embed).view(2 * kmax, H, d).transpose(0, 1)  # (H, 2k, d)
    want_p2c = hf_p2c_reference(k, qr, n, kmax)
    torch.testing.assert_close(m.terms(q, k, pos, pos)["p2c"], want_p2c)

    cfg = DebertaConfig(hidden_size=H * d, num_attention_heads=H, relative_attention=True,
                        max_relative_positions=kmax, pos_att_type=["c2p", "p2c"], attention_probs_dropout_prob=0.0)
    hf = DisentangledSelfAttention(cfg).double()
    with torch.no_grad():
        hf.pos_proj.weight.copy_(m.w_kr.weight)
        hf.pos_q_proj.weight.copy_(m.w_qr.weight)
        hf.pos_q_proj.bias.copy_(m.w_qr.bias)
    q_scaled = q / math.sqrt(3 * d)  # transformers scales q (and the position queries) before the terms
    bias = hf.disentangled_att_bias(q_scaled, k, build_relative_position(q, k), m.rel_embed, 3)
    torch.testing.assert_close(m(q, k, pos, pos), q_scaled @ k.transpose(-1, -2) + bias)
    paper = DebertaRelative(H, d, kmax, p2c_convention="paper").double()
    paper.load_state_dict(m.state_dict())
    assert not torch.allclose(paper(q, k, pos, pos), m(q, k, pos, pos))


# --- ALiBi ---------------------------------------------------------------------------------------

def ref_alibi_slopes(n: int) -> list[float]:
    """The rule of the ALiBi reference code, written independently."""
    if math.log2(n).is_integer():
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]
    c = 2 ** math.floor(math.log2(n))
    return ref_alibi_slopes(c) + ref_alibi_slopes(2 * c)[0::2][: n - c]


def test_alibi_slopes_published_and_non_power_of_two():
    assert alibi_slopes(8).tolist() == [1 / 2 ** i for i in range(1, 9)]  # paper: 1/2, 1/4, ..., 1/256
    want16 = torch.tensor([2 ** (-i / 2) for i in range(1, 17)], dtype=torch.float64)  # 1/sqrt(2), 1/2, ...
    torch.testing.assert_close(alibi_slopes(16), want16)
    for n in (1, 3, 5, 6, 12, 20, 24):
        torch.testing.assert_close(alibi_slopes(n), torch.tensor(ref_alibi_slopes(n), dtype=torch.float64))
    assert alibi_slopes(12)[8:].tolist() == pytest.approx([2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5])


def test_alibi_bias_symmetric_and_causal():
    pos = torch.tensor([0.0, 1.0, 2.5, 6.0])
    sym = AlibiBias(4)(pos, pos)
    causal = AlibiBias(4, causal=True)(pos, pos)
    m = torch.tensor(ref_alibi_slopes(4))
    for h in range(4):
        for i in range(4):
            for j in range(4):
                d = float(pos[i] - pos[j])
                assert sym[h, i, j].item() == pytest.approx(-float(m[h]) * abs(d))
                want = -float(m[h]) * d if j <= i else float("-inf")
                assert causal[h, i, j].item() == pytest.approx(want)
    assert AlibiBias(2)(pos, pos, dtype=torch.bfloat16).dtype == torch.bfloat16
    assert "slopes" not in AlibiBias(2).state_dict()
