"""Qwen towers and the encodings that need a grid (issue 53): Qwen2-VL / Qwen2.5-VL take images of any
size and their configs name no grid, so learned_abs, relbias and relpos_decomposed are refused with an
error that says to pass ``pe_kwargs={"grid": ...}``, and work when it is passed; Qwen3-VL's config names
its table's grid, which they take. ``tower.encoding`` finds the encoding whatever its family."""
from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import load_compare_script
from vispe.models.vit import convert_vit

pt = load_compare_script("parity_towers")


@pytest.fixture(scope="module")
def qwen2():
    return pt.TOWERS["qwen2_vl"].build("tiny")


@pytest.mark.parametrize("pe", ["learned_abs", "relbias", "relpos_decomposed"])
def test_a_grid_needing_encoding_without_a_grid_names_pe_kwargs_grid(qwen2, pe):
    with pytest.raises(ValueError, match=rf"pe='{pe}' needs the grid .* pe_kwargs=\{{'grid': \(h, w\)\}}"):
        convert_vit(qwen2, pe=pe)


def test_relbias_with_its_grid_given_is_built_for_it_and_a_zero_table_is_no_bias(qwen2):
    t = convert_vit(qwen2, pe="relbias", pe_kwargs={"grid": (4, 6)})
    ref = convert_vit(qwen2, pe="none")
    assert t.encoding is t.blocks[0].attn.pe and t.encoding.grid == (4, 6)
    C = qwen2.config.in_channels * qwen2.config.temporal_patch_size * qwen2.config.patch_size ** 2
    x, grid = torch.randn(24, C, generator=torch.Generator().manual_seed(0)), torch.tensor([[1, 4, 6]])
    with torch.no_grad():
        for blk in t.blocks:
            for p in blk.attn.pe.parameters():
                p.zero_()
        got, want = t(x, grid).last_hidden_state, ref(x, grid).last_hidden_state
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)  # the bias is all that differs
        table = next(t.blocks[0].attn.pe.parameters())
        table.copy_(torch.randn(table.shape, generator=torch.Generator().manual_seed(1)))  # a constant would cancel
        assert (t(x, grid).last_hidden_state - want).abs().max() > 1e-3  # and it is used


def test_qwen3_takes_the_grid_of_its_configs_table():
    q3 = pt.TOWERS["qwen3_vl"].build("tiny")
    n = math.isqrt(int(q3.config.num_position_embeddings))
    t = convert_vit(q3, pe="learned_abs")
    assert t.encoding is t.pe and tuple(t.pe.grid) == (n, n)
    torch.testing.assert_close(t.pe.pos_embed[0], q3.pos_embed.weight.detach())  # the table moved in


def test_the_native_encoding_is_found_by_encoding(qwen2):
    t = convert_vit(qwen2)
    assert t.pe is None and t.encoding is t.blocks[0].attn.pe
    assert t.encoding.registry_name == "rope_axial"
