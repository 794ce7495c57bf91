"""Every vispe.analysis figure on a case whose answer is known."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from conftest import build_for_test  # noqa: E402
from vispe.analysis import (  # noqa: E402
    attention_distance as AD,  # noqa: E402
    codes,
    decay,
    similarity,
    tables,
)
from vispe.models.vit import create_vit  # noqa: E402

SHAPE = (3, 5)  # non-square: a (y, x) slip shows


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_sine_similarity_map_is_symmetric_with_a_maximal_diagonal():
    pe = build_for_test("sine", grid=SHAPE, dim=32, normalize=False)
    sim = codes.similarity_matrix(pe, SHAPE)
    torch.testing.assert_close(sim, sim.t())
    torch.testing.assert_close(sim.diagonal(), torch.ones(15))
    assert (sim - torch.eye(15) < 1 - 1e-3).all()  # every other position is less similar than itself
    fig = similarity.similarity_figure(pe, SHAPE)
    assert isinstance(fig, Figure)
    img = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(img.filled(np.nan), similarity.mosaic(sim.numpy(), SHAPE), equal_nan=True)
    # tile (y, x) = (1, 3) is row 1*5+3 of the matrix, at rows 4..6, columns 18..22 of the mosaic
    np.testing.assert_allclose(img[4:7, 18:23], sim[8].reshape(3, 5).numpy())


def test_relbias_heat_map_equals_its_table():
    pe = build_for_test("relbias", grid=SHAPE)
    fig = tables.bias_table_figure(pe, SHAPE)
    want = pe.table.detach().t().reshape(2, 2 * 3 - 1, 2 * 5 - 1).numpy()  # (heads, dy, dx), query - key
    got = np.stack([ax.images[0].get_array() for ax in fig.axes if ax.images])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)


def test_learned_rowcol_heat_maps_are_its_row_and_column_tables():
    pe = build_for_test("learned_rowcol", grid=SHAPE, dim=16)
    rows, cols = tables.rowcol_tables(pe, SHAPE)
    np.testing.assert_array_equal(rows, pe.row.weight.detach()[:3].numpy())
    np.testing.assert_array_equal(cols, pe.col.weight.detach()[:5].numpy())
    fig = tables.rowcol_figure(pe, SHAPE)
    np.testing.assert_array_equal(fig.axes[0].images[0].get_array(), rows)


@pytest.mark.parametrize("name, invariant", [("rope_axial", True), ("rope_mixed", True), ("relbias_axis", True),
                                             ("learned_abs", False), ("normidx2d", False)])
def test_offset_map_spread_is_zero_exactly_for_relative_encodings(name, invariant):
    pe = build_for_test(name, grid=SHAPE)
    mean, spread = codes.offset_map(codes.similarity_matrix(pe, SHAPE), SHAPE)
    assert mean.shape == spread.shape == (5, 9)
    assert (spread.max() < 1e-5) == invariant
    fig = decay.offset_figure(pe, SHAPE)
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), mean.numpy())


def test_rope_offset_map_is_the_cosine_kernel():
    """Axial RoPE codes: cos-sim at offset (dy, dx) = mean over pairs of cos(dy * f_y) and cos(dx * f_x)."""
    pe = build_for_test("rope_axial", grid=SHAPE)
    mean, _ = codes.offset_map(codes.similarity_matrix(pe, SHAPE), SHAPE)
    assert mean[2, 4] == pytest.approx(1.0, abs=1e-6)  # offset (0, 0)
    ang = pe(SHAPE, None).detach()[0, 0]  # (N, d/2): y pairs then x pairs
    fy, fx = ang[5, : ang.shape[-1] // 2], ang[1, ang.shape[-1] // 2:]  # y = 1 row, x = 1 column: the frequencies
    want = (torch.cos(1 * fy).sum() + torch.cos(-2 * fx).sum()) / ang.shape[-1]  # offset (dy, dx) = (1, -2)
    assert float(mean[2 + 1, 4 - 2]) == pytest.approx(float(want), abs=1e-5)


def test_resolution_view_keeps_relative_places_and_grows_the_grid():
    pe = build_for_test("sincos2d", grid=(4, 4), dim=32)
    refs = {"centre": (0.5, 0.5), "corner": (0.0, 0.0)}
    small, big = similarity.reference_maps(pe, (4, 4), refs), similarity.reference_maps(pe, (8, 8), refs)
    assert small["corner"].shape == (4, 4) and big["corner"].shape == (8, 8)
    assert np.unravel_index(big["corner"].argmax(), (8, 8)) == (0, 0)
    np.testing.assert_allclose(small["corner"], codes.similarity_matrix(pe, (4, 4))[0].reshape(4, 4).numpy())
    fig = similarity.resolution_figure(pe, (4, 4), (8, 8))
    shapes = [ax.images[0].get_array().shape for ax in fig.axes if ax.images]
    assert shapes == [(4, 4)] * 3 + [(8, 8)] * 3


def test_attention_distance_known_cases():
    shape = (2, 3)
    eye = torch.eye(6).expand(1, 2, 6, 6)
    np.testing.assert_allclose(AD.mean_attention_distance(eye, shape), [0.0, 0.0])
    c = [(y, x) for y in range(2) for x in range(3)]
    brute = np.mean([np.mean([np.hypot(a[0] - b[0], a[1] - b[1]) for b in c]) for a in c]) * 4
    uniform = torch.full((1, 1, 7, 7), 1 / 7)  # one prefix token: renormalised over the grid keys
    np.testing.assert_allclose(AD.mean_attention_distance(uniform, shape, 1, patch_size=4), [brute])
    with pytest.raises(ValueError, match="expected"):
        AD.mean_attention_distance(eye, (3, 3))


def test_captured_attention_is_softmax_of_the_bias_when_q_and_k_are_zero():
    torch.manual_seed(0)
    model = create_vit("vit_pico", pe="relbias", img_size=8, patch_size=4, num_classes=3, depth=2)
    for blk in model.blocks:  # q = k = 0: the logits are the relative bias alone
        with torch.no_grad():
            blk.attn.qkv.weight[:128] = 0
            blk.attn.qkv.bias[:128] = 0
            blk.attn.pe.table.normal_()
    probs = AD.capture_attention(model, torch.randn(2, 3, 8, 12))
    assert len(probs) == 2
    for blk, p in zip(model.blocks, probs):
        want = blk.attn.pe((2, 3), None).softmax(-1)  # (1, heads, 1+6, 1+6)
        torch.testing.assert_close(p, want.expand_as(p).detach())
    d = AD.attention_distances(model, torch.randn(1, 3, 8, 12))
    assert d.shape == (2, 4) and (d > 0).all()
    assert isinstance(AD.attention_distance_figure({"relbias": model}, torch.randn(1, 3, 8, 12)), Figure)


def test_codes_refuse_what_has_no_code():
    with pytest.raises(ValueError, match="bias_matrix"):
        codes.position_codes(build_for_test("relbias", grid=SHAPE), SHAPE)
    with pytest.raises(ValueError, match="additive and rotary"):
        codes.similarity_matrix(build_for_test("peg", grid=SHAPE), SHAPE)
