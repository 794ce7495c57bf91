"""Checkpoints know the grid of their learned tables (issue 19, item 11).

A state_dict saved at one grid and loaded at another is resized by the encoding's own rule or
refused with a ValueError naming both grids; never read with the other grid's axes because the
sizes match (an 8x12 ``learned_abs`` table into a 12x8 model, a 3x5 ``relbias`` table into 5x3).
"""
import io

import pytest
import timm
import torch

import vispe
from vispe.axis.learned import resize_table_1d
from vispe.encoding import GRID_KEY
from vispe.image.learned_abs import resample_grid_table
from vispe.image.relbias import resize_relative_table
from vispe.models.vit import create_vit


def _roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _vit(pe, img_size, **kw):
    torch.manual_seed(0)
    return create_vit("vit_pico", pe=pe, embed_dim=32, depth=1, num_heads=2, img_size=img_size, patch_size=4,
                      num_classes=3, **kw)


def test_vit_learned_abs_saved_at_8x12_is_resampled_into_a_12x8_model_not_read_transposed():
    a, b = _vit("learned_abs", (32, 48)), _vit("learned_abs", (48, 32))
    assert a.pe.grid == (8, 12) and b.pe.grid == (12, 8)
    sd = _roundtrip(a.state_dict())
    b.load_state_dict(sd)
    want = resample_grid_table(a.pe.pos_embed.detach(), (8, 12), (12, 8))
    torch.testing.assert_close(b.pe.pos_embed.detach(), want)
    torch.testing.assert_close(b.pe.prefix_embed, a.pe.prefix_embed)
    # the record lives in the state_dict's metadata: the keys stay timm's, so timm still loads it
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=(32, 48), patch_size=4,
                            embed_dim=32, depth=1, num_heads=2, num_classes=3, mlp_ratio=4.0)
    assert set(sd) == set(ref.state_dict())
    ref.load_state_dict(sd)
    assert sd._metadata["pe"][GRID_KEY] == (8, 12)


def test_vit_learned_abs_without_a_record_follows_timms_rule():
    """A timm checkpoint (or a copy that lost the metadata): the model's own grid when the token
    count matches, else a square grid, else a ValueError saying how to name the grid."""
    a, b = _vit("learned_abs", (32, 48)), _vit("learned_abs", (48, 32))
    b.load_state_dict(dict(a.state_dict()))  # no record: 96 tokens are taken as b's own 12x8 grid
    torch.testing.assert_close(b.pe.pos_embed, a.pe.pos_embed)
    sq = _vit("learned_abs", 32)  # 8x8 table, no record: read as square
    b.load_state_dict(dict(sq.state_dict()))
    torch.testing.assert_close(b.pe.pos_embed.detach(), resample_grid_table(sq.pe.pos_embed.detach(), (8, 8), (12, 8)))
    odd = _vit("learned_abs", (16, 24))  # 4x6 = 24 tokens: neither b's 96 nor a square
    with pytest.raises(ValueError, match=r"24 grid positions.*load_pos_embed"):
        b.load_state_dict(dict(odd.state_dict()))
    b.load_pos_embed(odd.state_dict()["pos_embed"], (4, 6))  # naming the grid works
    torch.testing.assert_close(b.pe.pos_embed.detach(), resample_grid_table(odd.pe.pos_embed.detach(), (4, 6), (12, 8)))


def test_vit_relbias_checkpoint_loads_at_another_image_size_and_at_the_transposed_grid():
    a = _vit("relbias", (12, 20))  # 3x5 window
    sd = _roundtrip(a.state_dict())
    assert sd[f"blocks.0.attn.pe.{GRID_KEY}"].tolist() == [3, 5]
    for size, grid in (((20, 12), (5, 3)), ((16, 16), (4, 4))):
        b = _vit("relbias", size)
        b.load_state_dict(sd)
        want = resize_relative_table(a.blocks[0].attn.pe.table.detach(), (3, 5), grid)
        torch.testing.assert_close(b.blocks[0].attn.pe.table.detach(), want)


def _enc(name, **kw):
    torch.manual_seed(0)
    return vispe.build(name, **kw)


CASES = {  # name, kwargs at grid (3, 5) -> kwargs at (5, 3), the expected tables after loading
    "learned_abs": ("learned_abs", lambda g: dict(dim=8, grid=g),
                    lambda src: {"pos_embed": resample_grid_table(src.pos_embed.detach(), (3, 5), (5, 3))}),
    "relbias": ("relbias", lambda g: dict(num_heads=2, grid=g),
                lambda src: {"table": resize_relative_table(src.table.detach(), (3, 5), (5, 3))}),
    "axis2d": ("axis2d", lambda g: dict(dim=8, axis="learned", grid=g),
               lambda src: {"row.weight": resize_table_1d(src.row.weight.detach(), 5),
                            "col.weight": resize_table_1d(src.col.weight.detach(), 3)}),
    "learned_rowcol": ("learned_rowcol", lambda g: dict(dim=8, max_size=g),
                       lambda src: {"row.weight": resize_table_1d(src.row.weight.detach(), 5),  # shorter: resampled
                                    "col.weight": src.col.weight.detach()[:3]}),  # longer: its first rows
}


@pytest.mark.parametrize("key", list(CASES))
def test_encoding_saved_at_3x5_loads_at_5x3_by_its_own_rule(key):
    name, kw, expect = CASES[key]
    src = _enc(name, **kw((3, 5)))
    sd = _roundtrip(src.state_dict())
    assert sd[GRID_KEY].tolist() == [3, 5]
    dst = _enc(name, **kw((5, 3)))
    dst.load_state_dict(sd)
    got = dst.state_dict()
    assert got[GRID_KEY].tolist() == [5, 3]
    for k, v in expect(src).items():
        torch.testing.assert_close(got[k], v)


@pytest.mark.parametrize("name, kw", [("learned_abs", lambda g: dict(dim=8, grid=g, overflow="error")),
                                      ("axis2d", lambda g: dict(dim=8, axis="learned", grid=g, overflow="error")),
                                      ("learned_rowcol", lambda g: dict(dim=8, max_size=g, overflow="error"))])
def test_a_table_too_small_for_the_grid_with_overflow_error_is_refused_naming_both_grids(name, kw):
    sd = _enc(name, **kw((3, 5))).state_dict()
    dst = _enc(name, **kw((5, 3)))
    with pytest.raises(ValueError, match=r"\(3, 5\).*\(5, 3\)"):
        dst.load_state_dict(sd)
    _enc(name, **kw((2, 4))).load_state_dict(sd)  # shrinking is within the table: allowed


def test_a_record_that_contradicts_the_table_shapes_is_refused():
    sd = _enc("relbias", num_heads=2, grid=(3, 5)).state_dict()
    sd[GRID_KEY] = torch.tensor([4, 4])
    with pytest.raises(ValueError, match=r"grid \(4, 4\).*45 rows"):
        _enc("relbias", num_heads=2, grid=(3, 5)).load_state_dict(sd)


def test_older_state_dicts_without_a_record_still_load():
    for name, kw, _ in CASES.values():
        src = _enc(name, **kw((3, 5)))
        sd = {k: v for k, v in src.state_dict().items() if k != GRID_KEY}
        dst = _enc(name, **kw((3, 5)))
        dst.load_state_dict(sd)
        assert all(torch.equal(dst.state_dict()[k], v) for k, v in sd.items())
