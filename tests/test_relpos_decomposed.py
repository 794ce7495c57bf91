"""relpos_decomposed (SAM / MViTv2 decomposed relative position) against a faithful copy of SAM's
``get_rel_pos`` / ``get_decomposed_rel_pos`` (transformers ``SamVisionAttention``), element by
element on non-square grids, with query and key sizes apart, and position by position."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vispe
from vispe.image.relpos_decomposed import decomposed_rel_pos, rel_pos_table


# --- faithful copy of transformers' SamVisionAttention.get_rel_pos / get_decomposed_rel_pos -------------
def ref_get_rel_pos(q_size: int, k_size: int, rel_pos: torch.Tensor) -> torch.Tensor:
    max_rel_dist = int(2 * max(q_size, k_size) - 1)
    rel_pos_resized = F.interpolate(
        rel_pos.reshape(1, rel_pos.shape[0], -1).transpose(1, 2),
        size=max_rel_dist,
        mode="linear",
    )
    rel_pos_resized = rel_pos_resized.reshape(-1, max_rel_dist).permute(1, 0)
    q_coords = torch.arange(q_size)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size)[None, :] * max(q_size / k_size, 1.0)
    relative_coords = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return rel_pos_resized[relative_coords.long()]


def ref_decomposed(query, rel_pos_h, rel_pos_w, q_size, k_size):
    query_height, query_width = q_size
    key_height, key_width = k_size
    relative_position_height = ref_get_rel_pos(query_height, key_height, rel_pos_h)
    relative_position_width = ref_get_rel_pos(query_width, key_width, rel_pos_w)
    batch_size, _, dim = query.shape
    reshaped_query = query.reshape(batch_size, query_height, query_width, dim)
    rel_h = torch.einsum("bhwc,hkc->bhwk", reshaped_query, relative_position_height)
    rel_w = torch.einsum("bhwc,wkc->bhwk", reshaped_query, relative_position_width)
    return rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]  # (B, qh, qw, kh, kw)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("q, k, rows", [(3, 5, 9), (5, 3, 9), (4, 4, 7), (7, 2, 5), (2, 7, 21), (6, 6, 9)])
def test_rel_pos_table_equals_sams_get_rel_pos(q, k, rows):
    """Same and different query/key lengths, tables grown, shrunk and at their own size."""
    table = torch.randn(rows, 6)
    torch.testing.assert_close(rel_pos_table(q, k, table), ref_get_rel_pos(q, k, table), rtol=0, atol=1e-6)


def test_decomposed_bias_equals_sams_with_query_and_key_grids_apart():
    g = torch.Generator().manual_seed(0)
    rh, rw = torch.randn(7, 8, generator=g), torch.randn(9, 8, generator=g)  # built for a 4x5 grid
    for q_size, k_size in (((3, 5), (3, 5)), ((3, 5), (6, 4)), ((5, 2), (2, 7)), ((4, 5), (4, 5))):
        q = torch.randn(6, q_size[0] * q_size[1], 8, generator=g)  # (B*heads, N, C)
        want = ref_decomposed(q, rh, rw, q_size, k_size).reshape(6, q.shape[1], -1)
        torch.testing.assert_close(decomposed_rel_pos(q, rh, rw, q_size, k_size), want, rtol=1e-5, atol=1e-5)


def _encoding(grid=(3, 5), prefix=0):
    torch.manual_seed(0)
    pe = vispe.build("relpos_decomposed", num_heads=2, head_dim=8, grid=grid, num_prefix_tokens=prefix, init_std=0.3)
    return pe


@pytest.mark.parametrize("shape", [(3, 5), (4, 7), (2, 3)])
def test_the_encoding_equals_sam_at_its_grid_and_resized_at_others(shape):
    """At the built 3x5 grid and at grids where SAM resizes the tables (grown, shrunk, both orientations)."""
    pe = _encoding()
    h, w = shape
    q = torch.randn(2, 2, h * w, 8)  # (B, heads, N, d)
    got = pe(shape, q=q)  # (B, heads, N, N)
    want = ref_decomposed(q.reshape(4, h * w, 8), pe.rel_pos_h.detach(), pe.rel_pos_w.detach(), shape, shape)
    torch.testing.assert_close(got, want.reshape(2, 2, h * w, h * w), rtol=1e-5, atol=1e-5)


def test_position_by_position_y_reads_rel_pos_h_and_x_reads_rel_pos_w():
    """On a 3x5 grid: bias[i, j] = q_i . R_h[y_i - y_j + 2] + q_i . R_w[x_i - x_j + 4], token i at divmod(i, 5)."""
    pe = _encoding()
    h, w = 3, 5
    q = torch.randn(1, 2, h * w, 8)
    bias = pe((h, w), q=q)[0]  # (heads, N, N)
    Rh, Rw = pe.rel_pos_h.detach(), pe.rel_pos_w.detach()
    for head in range(2):
        for i in range(h * w):
            yi, xi = divmod(i, w)
            for j in range(h * w):
                yj, xj = divmod(j, w)
                want = q[0, head, i] @ Rh[yi - yj + h - 1] + q[0, head, i] @ Rw[xi - xj + w - 1]
                torch.testing.assert_close(bias[head, i, j], want, rtol=1e-5, atol=1e-5)
    swapped = vispe.build("relpos_decomposed", num_heads=2, head_dim=8, grid=(3, 5))
    with torch.no_grad():  # the tables on the other axes (resized to fit): not the same bias
        swapped.rel_pos_h.copy_(F.interpolate(Rw.t()[None], size=5, mode="linear")[0].t())
        swapped.rel_pos_w.copy_(F.interpolate(Rh.t()[None], size=9, mode="linear")[0].t())
    assert (swapped((h, w), q=q)[0] - bias).abs().max() > 1e-2


def test_prefix_tokens_take_the_bias_familys_learned_scalars():
    pe = _encoding(prefix=2)
    with torch.no_grad():
        pe.prefix_to_token.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        pe.token_to_prefix.copy_(torch.tensor([[5.0, 6.0], [7.0, 8.0]]))
        pe.prefix_to_prefix.fill_(9.0)
    q = torch.randn(1, 2, 2 + 15, 8)
    bias = pe((3, 5), q=q)[0]  # (heads, 17, 17)
    assert torch.equal(bias[1, 0, 2:], torch.full((15,), 3.0)) and torch.equal(bias[0, 5:, 1], torch.full((12,), 6.0))
    assert torch.equal(bias[:, :2, :2], torch.full((2, 2, 2), 9.0))
    grid_only = _encoding(prefix=0)
    grid_only.load_state_dict({k: v for k, v in pe.state_dict().items() if k.startswith("rel_pos")} | {
        "table_grid": torch.tensor([3, 5])})
    torch.testing.assert_close(bias[:, 2:, 2:], grid_only((3, 5), q=q[:, :, 2:])[0])  # the grid part ignores prefix q


def test_sam_checkpoint_tables_load_at_another_grid_by_sams_rule_and_bad_input_is_refused():
    src = _encoding(grid=(4, 6))
    sd = {"rel_pos_h": src.rel_pos_h.detach(), "rel_pos_w": src.rel_pos_w.detach()}  # SAM's keys, no record
    dst = vispe.build("relpos_decomposed", num_heads=2, head_dim=8, grid=(6, 3))
    dst.load_state_dict(sd)
    for got, table, n in ((dst.rel_pos_h, sd["rel_pos_h"], 11), (dst.rel_pos_w, sd["rel_pos_w"], 5)):
        torch.testing.assert_close(got, F.interpolate(table.t()[None], size=n, mode="linear")[0].t())  # SAM's resize
    q = torch.randn(1, 2, 18, 8)
    torch.testing.assert_close(dst((6, 3), q=q), src((6, 3), q=q))  # loaded = resized at run time
    with pytest.raises(ValueError, match="grid=None"):
        vispe.build("relpos_decomposed", num_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="q=NoneType"):
        _encoding()((3, 5))
    with pytest.raises(ValueError, match="init_std=-1"):
        vispe.build("relpos_decomposed", num_heads=2, head_dim=8, grid=(2, 2), init_std=-1)
