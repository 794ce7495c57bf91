"""EoMT converted (vispe.models.towers.eomt): parity with transformers' EomtForUniversalSegmentation and
EomtDinov3ForUniversalSegmentation (tiny configs, random weights, every parameter perturbed), the whole
model at other sizes against the original made to run there, a fine-tuning step, named encodings, the
padding mask, refusals."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vispe.models.vit import convert_vit

tf = pytest.importorskip("transformers")

FIELDS = ("masks_queries_logits", "class_queries_logits", "last_hidden_state")
KW = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, image_size=32, patch_size=4,
          num_register_tokens=2, num_queries=5, num_blocks=2, num_upscale_blocks=2, num_labels=3)


def _perturb(model, scale=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # config-built models start with zero registers and ones as layer scales
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


def eomt(**kw):
    torch.manual_seed(0)
    return _perturb(tf.EomtForUniversalSegmentation(tf.EomtConfig(mlp_ratio=2, **{**KW, **kw})))


def eomt_dinov3(**kw):
    torch.manual_seed(0)
    return _perturb(tf.EomtDinov3ForUniversalSegmentation(tf.EomtDinov3Config(intermediate_size=64, **{**KW, **kw})))


def _close(got, want, tol=1e-4):
    for f in FIELDS:
        torch.testing.assert_close(getattr(got, f), getattr(want, f), rtol=tol, atol=tol)


@pytest.mark.parametrize("make", [eomt, eomt_dinov3], ids=["eomt", "eomt_dinov3"])
def test_parity_at_the_native_size_with_hidden_states_tuples_and_the_loss(make):
    hf = make()
    m = convert_vit(hf)
    assert type(m).__name__ == "EomtTower" and m.pe_name == ("learned_abs" if make is eomt else "rope_axial")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want, got = hf(x, output_hidden_states=True), m(x, output_hidden_states=True)
        assert type(got) is type(want)
        _close(got, want)
        assert len(got.hidden_states) == len(want.hidden_states) == 5
        for a, b in zip(got.hidden_states, want.hidden_states):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        tup, tup_hf = m(x, return_dict=False), hf(x, return_dict=False)
        assert isinstance(tup, tuple) and len(tup) == len(tup_hf)
        g = torch.Generator().manual_seed(1)
        labels = [torch.rand(2, 32, 32, generator=g).round() for _ in range(2)]
        classes = [torch.tensor([0, 2]), torch.tensor([1, 1])]
        torch.manual_seed(3)  # the criterion samples points at random: the same draws for both
        loss_hf = hf(x, mask_labels=labels, class_labels=classes).loss
        torch.manual_seed(3)
        loss = m(x, mask_labels=labels, class_labels=classes).loss
        torch.testing.assert_close(loss, loss_hf, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="output_attentions=True"):
        m(x, output_attentions=True)


def _hf_eomt_at(hf, grid):
    """The original made to run at ``grid``: its table resampled (bicubic, target size; growing, so no
    antialias: vispe's learned_abs rule written out with F.interpolate) and its head's grid set."""
    emb = hf.embeddings
    C = emb.position_embeddings.weight.shape[1]
    g = hf.grid_size
    table = emb.position_embeddings.weight.detach().T.reshape(1, C, *g)
    table = F.interpolate(table, size=grid, mode="bicubic", align_corners=False).reshape(C, -1).T
    emb.position_embeddings = nn.Embedding.from_pretrained(table.contiguous(), freeze=False)
    emb.position_ids = torch.arange(grid[0] * grid[1])[None]
    hf.grid_size = tuple(grid)
    return hf


@pytest.mark.parametrize("size", [(32, 48), (48, 40), (40, 40)])
def test_eomt_at_other_sizes_resamples_its_table_and_reshapes_its_head(size):
    hf = eomt()
    m = convert_vit(hf)
    x = torch.randn(2, 3, *size)
    with pytest.raises(RuntimeError):
        hf(x)  # transformers' EoMT runs at its config size only
    grid = (size[0] // 4, size[1] // 4)
    with torch.no_grad():
        got, want = m(x), _hf_eomt_at(hf, grid)(x)
    assert got.masks_queries_logits.shape == (2, 5, 4 * grid[0], 4 * grid[1])
    assert got.last_hidden_state.shape == (2, 5 + 3 + grid[0] * grid[1], 32)
    assert all(torch.isfinite(getattr(got, f)).all() for f in FIELDS)
    _close(got, want)


@pytest.mark.parametrize("size", [(32, 48), (48, 24), (40, 40)])
def test_eomt_dinov3_at_other_sizes_equals_transformers_with_its_head_grid_set(size):
    """DINOv3's RoPE runs at any size in transformers too: set its head's grid and the two agree."""
    hf = eomt_dinov3()
    m = convert_vit(hf)
    x = torch.randn(2, 3, *size)
    with pytest.raises(RuntimeError):
        hf(x)
    grid = (size[0] // 4, size[1] // 4)
    hf.grid_size = grid
    with torch.no_grad():
        got, want = m(x), hf(x)
    assert got.masks_queries_logits.shape == (2, 5, 4 * grid[0], 4 * grid[1])
    _close(got, want)


@pytest.mark.parametrize("make,pe", [(eomt, None), (eomt_dinov3, "rope_mixed")], ids=["eomt", "dinov3_rope_mixed"])
def test_a_fine_tuning_step_at_another_size_reaches_the_encoding(make, pe):
    m = convert_vit(make(), pe=pe).train()
    x = torch.randn(2, 3, 24, 40)
    g = torch.Generator().manual_seed(1)
    labels = [torch.rand(2, 24, 40, generator=g).round() for _ in range(2)]
    classes = [torch.tensor([0, 2]), torch.tensor([1, 1])]
    out = m(x, mask_labels=labels, class_labels=classes)
    out.loss.backward()
    pe_params = [p for n, p in m.named_parameters() if n in m.no_weight_decay()]
    assert pe_params and all(p.grad is not None and p.grad.abs().max() > 0 for p in pe_params)
    before = [p.detach().clone() for p in pe_params]
    torch.optim.SGD(m.parameters(), lr=0.1).step()
    assert all((p - b).abs().max() > 0 for p, b in zip(pe_params, before))


def test_named_encodings_replace_the_original_and_learned_abs_takes_the_table_over():
    hf = eomt()
    m = convert_vit(hf, pe="rope_mixed")
    assert m.pe is None and all(b.attn.pe.registry_name == "rope_mixed" for b in m.blocks)
    m = convert_vit(hf, pe="learned_abs", pe_kwargs={"num_prefix_tokens": 0})
    torch.testing.assert_close(m.pe.pos_embed.detach()[0], hf.embeddings.position_embeddings.weight.detach())
    with_prefix = convert_vit(hf, pe="learned_abs")  # its learned prefix vectors go to the class and register tokens
    assert with_prefix.pe.prefix_embed.shape == (1, 3, 32)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        with_prefix.pe.prefix_embed.zero_()
        _close(with_prefix(x), hf(x))
        with_prefix.pe.prefix_embed.normal_()  # not a constant: LayerNorm would remove it
        assert (with_prefix(x).class_queries_logits - hf(x).class_queries_logits).abs().max() > 1e-3
    d = convert_vit(eomt_dinov3(), pe="sincos2d")
    assert d.pe.registry_name == "sincos2d" and all(b.attn.pe is None for b in d.blocks)


def _alone_and_padded(m, img, canvas=(40, 48)):
    big = torch.randn(2, 3, *canvas)
    h, w = img.shape[-2:]
    big[0, :, :h, :w] = img
    mask = torch.zeros(2, *canvas, dtype=torch.bool)
    mask[0, h:] = True
    mask[0, :, w:] = True
    with torch.no_grad():
        alone, padded = m(img[None]), m(big, mask=mask)
    return alone, padded, (h // 4 * 4, w // 4 * 4)


@pytest.mark.parametrize("make,kw", [(eomt_dinov3, {}), (eomt, {"pe_kwargs": {"num_prefix_tokens": 0,
                                                                                "mask_aware": True}})],
                         ids=["dinov3_rope", "eomt_mask_aware_table"])
def test_an_image_alone_equals_it_padded_in_a_batch(make, kw):
    m = convert_vit(make(), **kw)
    img = torch.randn(3, 24, 36)
    alone, padded, (H, W) = _alone_and_padded(m, img)
    torch.testing.assert_close(padded.masks_queries_logits[:1, :, :H, :W], alone.masks_queries_logits,
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(padded.class_queries_logits[:1], alone.class_queries_logits, rtol=1e-4, atol=1e-4)


def test_the_table_not_mask_aware_by_default_and_refusals():
    m = convert_vit(eomt())
    alone, padded, (H, W) = _alone_and_padded(m, torch.randn(3, 24, 36))
    assert (padded.class_queries_logits[:1] - alone.class_queries_logits).abs().max() > 1e-3
    with pytest.raises(ValueError, match="pe_at='every_block'"):
        convert_vit(eomt(), pe="sincos2d", pe_at="every_block")
    with pytest.raises(ValueError, match="keep_abs_pos=True"):
        convert_vit(eomt(), keep_abs_pos=True)
    with pytest.raises(ValueError, match="multiples of the patch size"):
        m(torch.randn(1, 3, 30, 32))
    hf = eomt_dinov3()
    hf.rope_embeddings.inv_freq.mul_(2)
    with pytest.raises(ValueError, match="rope_embeddings.inv_freq"):
        convert_vit(hf)
