"""Position conventions of SigLIP2 NaFlex and RT-DETR's AIFI as options (or defaults) of existing
encodings, each against a faithful copy of the reference function, position by position on
non-square grids (issue 37)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vispe


# --- faithful copy of transformers' Siglip2VisionEmbeddings.resize_positional_embeddings ----------------
def ref_siglip2_resize(positional_embeddings, spatial_shapes, max_length):
    batch_size = spatial_shapes.shape[0]
    embed_dim = positional_embeddings.shape[-1]
    source_dtype = positional_embeddings.dtype
    resulted_positional_embeddings = torch.empty((batch_size, max_length, embed_dim), dtype=source_dtype)
    positional_embeddings = positional_embeddings.permute(2, 0, 1).unsqueeze(0)
    positional_embeddings = positional_embeddings.to(torch.float32)
    for i in range(batch_size):
        height, width = spatial_shapes[i].tolist()
        resized_embeddings = F.interpolate(positional_embeddings, size=(height, width), mode="bilinear",
                                           align_corners=False, antialias=True)
        resized_embeddings = resized_embeddings.reshape(embed_dim, height * width).transpose(0, 1)
        resized_embeddings = resized_embeddings.to(source_dtype)
        resulted_positional_embeddings[i, : height * width] = resized_embeddings
        resulted_positional_embeddings[i, height * width:] = resized_embeddings[0]
    return resulted_positional_embeddings
# ---------------------------------------------------------------------------------------------------------


def test_learned_abs_pad_value_first_is_siglip2s_per_image_table_with_the_first_vector_in_padding():
    """A 4x4 table resized per image (grown, shrunk, non-square both ways), read slot by slot: valid slot
    n of image b is canvas cell divmod(n, w_b); every padded cell holds the image's first vector."""
    torch.manual_seed(0)
    n, dim = 4, 8
    pe = vispe.build("learned_abs", dim=dim, grid=(n, n), interpolation="bilinear", antialias="always",
                     mask_aware=True, pad_value="first")
    shapes = torch.tensor([[3, 6], [6, 2], [2, 3]])  # (h, w) per image
    H, W = 6, 6
    want = ref_siglip2_resize(pe.pos_embed.detach().reshape(n, n, dim), shapes, max_length=H * W)  # (B, 36, dim)
    mask = torch.ones(3, H, W, dtype=torch.bool)
    for b, (h, w) in enumerate(shapes.tolist()):
        mask[b, :h, :w] = False
    got = pe((H, W), mask)  # (B, H*W, dim) on the canvas
    for b, (h, w) in enumerate(shapes.tolist()):
        for slot in range(h * w):
            y, x = divmod(slot, w)
            torch.testing.assert_close(got[b, y * W + x], want[b, slot], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[b][mask[b].flatten()], want[b, h * w:h * w + int(mask[b].sum())],
                                   rtol=1e-5, atol=1e-6)
    edge = vispe.build("learned_abs", dim=dim, grid=(n, n), interpolation="bilinear", antialias="always",
                       mask_aware=True)
    edge.load_state_dict(pe.state_dict())
    torch.testing.assert_close(edge((H, W), mask)[~mask.flatten(1)], got[~mask.flatten(1)])  # valid cells agree
    assert (edge((H, W), mask)[mask.flatten(1)] - got[mask.flatten(1)]).abs().max() > 1e-3  # padding differs
    zeros = vispe.build("learned_abs", dim=dim, grid=(n, n), mask_aware=True, pad_value="zeros")
    assert torch.equal(zeros((H, W), mask)[mask.flatten(1)], torch.zeros(int(mask.sum()), dim))


def test_pad_value_needs_the_per_image_table():
    with pytest.raises(ValueError, match="pad_value='first' with mask_aware=False"):
        vispe.build("learned_abs", dim=8, grid=(4, 4), pad_value="first")
    with pytest.raises(ValueError, match="pad_value"):
        vispe.build("learned_abs", dim=8, grid=(4, 4), mask_aware=True, pad_value="last")


# --- faithful copies of RT-DETR's AIFI 2D sin-cos ---------------------------------------------------------
def ref_rtdetr_hf(height, width, embed_dim=256, temperature=10000.0):
    """transformers' build_2d_sinusoidal_position_embedding (after transformers#41380)."""
    pos_dim = embed_dim // 4
    omega = torch.arange(pos_dim, dtype=torch.float64) / pos_dim
    omega = 1.0 / temperature**omega
    grid_h = torch.arange(height, dtype=torch.float64)
    grid_w = torch.arange(width, dtype=torch.float64)
    grid_h, grid_w = torch.meshgrid(grid_h, grid_w, indexing="ij")
    emb_h = grid_h.flatten().outer(omega)
    emb_w = grid_w.flatten().outer(omega)
    pos_embed = torch.cat([emb_h.sin(), emb_h.cos(), emb_w.sin(), emb_w.cos()], dim=1)
    return pos_embed.to(torch.float32)


def ref_rtdetr_original(w, h, embed_dim=256, temperature=10000.0):
    """lyuwenyu/RT-DETR HybridEncoder.build_2d_sincos_position_embedding (named [sin w, cos w, sin h, cos h])."""
    grid_w = torch.arange(int(w), dtype=torch.float32)
    grid_h = torch.arange(int(h), dtype=torch.float32)
    grid_w, grid_h = torch.meshgrid(grid_w, grid_h, indexing="ij")
    pos_dim = embed_dim // 4
    omega = torch.arange(pos_dim, dtype=torch.float32) / pos_dim
    omega = 1.0 / (temperature ** omega)
    out_w = grid_w.flatten()[..., None] @ omega[None]
    out_h = grid_h.flatten()[..., None] @ omega[None]
    return torch.concat([out_w.sin(), out_w.cos(), out_h.sin(), out_h.cos()], dim=1)[None, :, :]
# ---------------------------------------------------------------------------------------------------------


def test_rtdetr_aifi_sincos_is_sincos2ds_default_position_by_position_on_a_non_square_grid():
    """AIFI's channels, pos_dim = C/4 each: [sin y, cos y, sin x, cos x] with omega_i = T^(-i/(C/4)), token
    y * w + x. vispe's sincos2d default holds exactly these numbers (no option needed)."""
    h, w, C, T = 3, 5, 32, 10000.0
    pe = vispe.build("sincos2d", dim=C, temperature=T)
    got = pe((h, w))[0]  # (h*w, C)
    torch.testing.assert_close(got, ref_rtdetr_hf(h, w, C, T), rtol=0, atol=1e-6)
    omega = T ** (-torch.arange(C // 4) / (C // 4))
    for i in range(h * w):
        y, x = divmod(i, w)
        want = torch.cat([(y * omega).sin(), (y * omega).cos(), (x * omega).sin(), (x * omega).cos()])
        torch.testing.assert_close(got[i], want, rtol=0, atol=1e-6)
    # the original code names its first half "w" but, through meshgrid(w, h, "ij"), encodes the row on the
    # square grids RT-DETR was trained on (so the released checkpoints see the same numbers) ...
    torch.testing.assert_close(pe((4, 4))[0], ref_rtdetr_original(4, 4, C, T)[0], rtol=0, atol=1e-6)
    # ... and scrambles positions on non-square ones (transformers#41380): not reproduced
    assert (ref_rtdetr_original(w, h, C, T)[0] - got).abs().max() > 0.1


# --- faithful copy of transformers' Idefics3VisionEmbeddings position ids (NaViT's buckets) ---------------
def ref_idefics3_position_ids(patch_attention_mask, num_patches_per_side):
    batch_size = patch_attention_mask.shape[0]
    max_nb_patches_h, max_nb_patches_w = patch_attention_mask.shape[1:]
    boundaries = torch.arange(1 / num_patches_per_side, 1.0, 1 / num_patches_per_side)
    position_ids = torch.full(size=(batch_size, max_nb_patches_h * max_nb_patches_w), fill_value=0)
    nb_patches_h = patch_attention_mask[:, :, 0].sum(dim=1)
    nb_patches_w = patch_attention_mask[:, 0, :].sum(dim=1)
    step_h = 1.0 / nb_patches_h
    step_w = 1.0 / nb_patches_w
    h_indices = torch.arange(patch_attention_mask.size(1), dtype=torch.float32)
    w_indices = torch.arange(patch_attention_mask.size(2), dtype=torch.float32)
    fractional_coords_h = h_indices[None, :] * step_h[:, None]
    fractional_coords_w = w_indices[None, :] * step_w[:, None]
    fractional_coords_h = torch.clamp(fractional_coords_h, max=(1.0 - 1e-6))
    fractional_coords_w = torch.clamp(fractional_coords_w, max=(1.0 - 1e-6))
    bucket_coords_h = torch.bucketize(fractional_coords_h, boundaries, right=True)
    bucket_coords_w = torch.bucketize(fractional_coords_w, boundaries, right=True)
    pos_ids = bucket_coords_h[:, :, None] * num_patches_per_side + bucket_coords_w[:, None, :]
    pos_ids = pos_ids.reshape(batch_size, -1)
    return torch.where(patch_attention_mask.view(batch_size, -1), pos_ids, position_ids)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N, extents", [(5, [(3, 7), (7, 2), (5, 5)]), (16, [(30, 11), (16, 16), (13, 29)])])
def test_learned_abs_bucket_is_idefics3s_navit_position_ids_patch_by_patch(N, extents):
    """Each image of a padded batch (valid area top-left, grown and shrunk against the N x N table, non-square
    both ways) reads the table row Idefics3 reads at every patch, padded patches row 0 (``pad_value="first"``)."""
    torch.manual_seed(0)
    H, W = max(h for h, _ in extents), max(w for _, w in extents)
    valid = torch.zeros(len(extents), H, W, dtype=torch.bool)
    for b, (h, w) in enumerate(extents):
        valid[b, :h, :w] = True
    pe = vispe.build("learned_abs", dim=4, grid=(N, N), interpolation="bucket", mask_aware=True, pad_value="first")
    table = pe.pos_embed.detach()[0]  # (N*N, 4)
    want = table[ref_idefics3_position_ids(valid, N)]  # (B, H*W, 4)
    assert torch.equal(pe((H, W), ~valid), want)
    full = ref_idefics3_position_ids(torch.ones(1, 3, 7, dtype=torch.bool), N)  # no mask: the whole grid
    assert torch.equal(pe((3, 7))[0], table[full[0]])
    with pytest.raises(ValueError, match="antialias='always' with interpolation='bucket'"):
        vispe.build("learned_abs", dim=4, grid=(N, N), interpolation="bucket", antialias="always")
