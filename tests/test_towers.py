"""Converted vision towers (vispe.models.towers) against transformers' classes, tiny configs with every
parameter redrawn (the entries of results/compare/parity_towers.py): parity of every output field
on square, non-square and packed variable-size inputs, the original's output conventions
(hidden_states, return_dict), another encoding swapped in (trains, batch-invariant where mask-aware),
and the refusals."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import load_compare_script
from vispe.models.vit import convert_vit

pt = load_compare_script("parity_towers")


@pytest.fixture(scope="module")
def originals():
    return {name: entry.build("tiny") for name, entry in pt.TOWERS.items()}


@pytest.mark.parametrize("name", sorted(pt.TOWERS))
def test_parity_with_transformers(name, originals):
    rows = pt.errors(pt.TOWERS[name], "tiny", original=originals[name])
    for label, field, err, scale in rows:
        assert scale > 0.5, (label, field, scale)  # a real output, not a vanishing one
        assert err < 1e-4, (label, field, err)
    if name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "pixtral"):  # variable-size families: a packed batch of two shapes
        assert any("packed" in r[0] for r in rows) and len({r[0] for r in rows}) == 3


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl", "pixtral", "llama4"])
def test_hidden_states_and_tuple_outputs_as_the_original(name, originals):
    m = originals[name]
    case = pt.TOWERS[name].cases(m, "tiny", torch.Generator().manual_seed(0))[-1]
    t = convert_vit(m)
    with torch.no_grad():
        want = m(*case.args, **case.kwargs, output_hidden_states=True)
        got = t(*case.args, **case.kwargs, output_hidden_states=True)
        tup_want = m(*case.args, **case.kwargs, return_dict=False)
        tup_got = t(*case.args, **case.kwargs, return_dict=False)
    assert len(got.hidden_states) == len(want.hidden_states) == len(t.blocks) + 1
    for a, b in zip(got.hidden_states, want.hidden_states):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    assert got.attentions is None and type(tup_got) is tuple and len(tup_got) == len(tup_want)
    for a, b in zip(tup_got, tup_want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_qwen_window_order_is_the_originals():
    """Qwen2.5-VL's last_hidden_state is in window order: a token order bug would not cancel here."""
    from vispe.models.towers.qwen_vl import merge_block_cells, window_token_order

    # 6 x 10 patches, merge 2 -> 3 x 5 merged tokens, windows of 2 x 2 merged tokens: 2 x 3 windows
    order = window_token_order(6, 10, 2, 2).view(-1, 4)[:, 0] // 4  # merged tokens in window order
    assert order.tolist() == [0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14]
    assert merge_block_cells(2, 4, 2).tolist() == [0, 1, 4, 5, 2, 3, 6, 7]


def test_swapped_encoding_trains_one_step_and_is_batch_invariant(originals):
    """Qwen2-VL's tower with rope_mixed: an image alone and packed beside another of another aspect
    ratio (and a 2-frame video) gives the same outputs; one SGD step moves the RoPE's frequencies and
    lowers the loss."""
    m = originals["qwen2_vl"]
    t = convert_vit(m, pe="rope_mixed")
    assert t.pe_name == "rope_mixed" and type(t.blocks[0].attn.pe).__name__ == "RopeMixed"
    C = m.config.in_channels * m.config.temporal_patch_size * m.config.patch_size ** 2
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4 * 6, C, generator=g), torch.randn(2 * 8 * 2, C, generator=g)
    with torch.no_grad():
        alone = t(a, torch.tensor([[1, 4, 6]]))
        packed = t(torch.cat([b, a]), torch.tensor([[2, 8, 2], [1, 4, 6]]))
    torch.testing.assert_close(packed.last_hidden_state[32:], alone.last_hidden_state, rtol=0, atol=2e-5)
    torch.testing.assert_close(packed.pooler_output[8:], alone.pooler_output, rtol=0, atol=2e-5)
    t.train()
    freqs = t.blocks[0].attn.pe.freqs
    before = freqs.detach().clone()
    opt = torch.optim.SGD(t.parameters(), lr=1e-2)
    x, grid = torch.cat([b, a]), torch.tensor([[2, 8, 2], [1, 4, 6]])
    loss = t(x, grid).pooler_output.square().mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in t.parameters())
    opt.step()
    assert not torch.equal(freqs.detach(), before)
    with torch.no_grad():
        assert t(x, grid).pooler_output.square().mean() < loss


@pytest.mark.parametrize("pe, kw", [("rope_mixed", {}), ("sine", {}), ("relbias", {}), ("peg", {}), ("none", {}),
                                    ("learned_abs", dict(mask_aware=True)), ("sine", dict(pe_at="every_block"))])
def test_pixtral_takes_any_encoding_and_mask_aware_ones_are_batch_invariant(pe, kw, originals):
    m = originals["pixtral"]
    kw = dict(kw)
    pe_at = kw.pop("pe_at", "input")
    t = convert_vit(m, pe=pe, pe_kwargs=kw, pe_at=pe_at).eval()
    g = torch.Generator().manual_seed(0)
    img = torch.randn(1, 3, 12, 20, generator=g)
    batch = torch.randn(2, 3, 24, 24, generator=g)
    batch[1:, :, :12, :20] = img
    with torch.no_grad():
        alone = t(img).last_hidden_state  # (1, 15, C)
        packed = t(batch, torch.tensor([[24, 16], [12, 20]])).last_hidden_state  # (1, 24 + 15, C)
    assert packed.shape == (1, 24 + 15, 32) and torch.isfinite(packed).all()
    from vispe.registry import get

    if get(pe).mask_aware or kw.get("mask_aware") or pe == "none":
        torch.testing.assert_close(packed[:, 24:], alone, rtol=0, atol=2e-5)


def test_llama4_encodings_table_kept_or_taken_over(originals):
    m = originals["llama4"]
    x = torch.randn(2, 3, 32, 32)
    native = convert_vit(m)
    same = convert_vit(m, pe="rope_axial", pe_kwargs=dict(base=10000.0, axis_order="xy", layout="interleaved",
                                                          offset=1), keep_abs_pos=True)
    with torch.no_grad():
        torch.testing.assert_close(same(x).last_hidden_state, native(x).last_hidden_state, rtol=0, atol=1e-6)
    table = convert_vit(m, pe="learned_abs")
    assert table.abs_pe is None and table.blocks[0].attn.pe is None
    torch.testing.assert_close(table.pe.pos_embed[0], m.positional_embedding_vlm[:-1])
    torch.testing.assert_close(table.pe.prefix_embed[0], m.positional_embedding_vlm[-1:])
    assert convert_vit(m, pe="rope_mixed").abs_pe is None
    with torch.no_grad():  # the converted tower runs at another (square) size; the original only at 32 x 32
        assert native(torch.randn(1, 3, 48, 48)).last_hidden_state.shape == (1, 9, 64)
    with pytest.raises(ValueError, match="keep_abs_pos=False with pe=None"):
        convert_vit(m, keep_abs_pos=False)


def test_refusals(originals):
    q, p, l4 = originals["qwen2_vl"], originals["pixtral"], originals["llama4"]
    t = convert_vit(q)
    x, grid = torch.randn(24, 24), torch.tensor([[1, 4, 6]])
    with pytest.raises(ValueError, match="output_attentions=True: vispe's attention runs on fused SDPA"):
        t(x, grid, output_attentions=True)
    with pytest.raises(ValueError, match="cu_seqlens: the converted QwenVisionTower computes"):
        t(x, grid, cu_seqlens=torch.tensor([0, 24]))
    with pytest.raises(ValueError, match=r"grid_thw\[0\]=\[1, 3, 8\]: expected t >= 1 and h, w positive multiples"):
        t(x, torch.tensor([[1, 3, 8]]))
    with pytest.raises(ValueError, match="hidden_states has 24 patches: expected sum"):
        t(x, torch.tensor([[1, 4, 4]]))
    with pytest.raises(ValueError, match="keep_abs_pos=True: this QwenVisionTower has no absolute table"):
        convert_vit(q, keep_abs_pos=True)
    bent = copy.deepcopy(q)
    bent.rotary_pos_emb.inv_freq.mul_(1.5)
    with pytest.raises(ValueError, match="rotary_pos_emb.inv_freq is not theta"):
        convert_vit(bent)
    bent = copy.deepcopy(p)
    bent.patch_positional_embedding.inv_freq.copy_(bent.patch_positional_embedding.inv_freq.flip(0))
    with pytest.raises(ValueError, match="patch_positional_embedding.inv_freq is not Pixtral's even/odd split"):
        convert_vit(bent)
    with pytest.raises(ValueError, match=r"image_sizes\[1\]=\[40, 8\]: expected at least one patch"):
        convert_vit(p)(torch.randn(2, 3, 24, 24), torch.tensor([[24, 24], [40, 8]]))
    with pytest.raises(ValueError, match="attention_mask is given: Llama4VisionModel ignores it"):
        convert_vit(l4)(torch.randn(1, 3, 32, 32), attention_mask=torch.ones(1, 17))
    bent = copy.deepcopy(l4)
    bent.rotary_embedding.freqs_ci = bent.rotary_embedding.freqs_ci.conj()
    with pytest.raises(ValueError, match="rotary_embedding.freqs_ci is not Llama 4's"):
        convert_vit(bent)


def test_qwen3_table_taken_over_by_a_named_learned_abs(originals):
    m = originals["qwen3_vl"]
    t = convert_vit(m, pe="learned_abs", pe_kwargs=dict(interpolation="bilinear", align_corners=True,
                                                        antialias=False, mask_aware=True))
    assert t.abs_pe is None and t.pe.grid == (5, 5) and t.blocks[0].attn.pe is None
    torch.testing.assert_close(t.pe.pos_embed[0], m.pos_embed.weight)
    with pytest.raises(ValueError, match=r"pe_kwargs=\{'grid': \(h, w\)\}"):
        convert_vit(originals["qwen2_vl"], pe="learned_abs")  # no native size: name the table's grid
