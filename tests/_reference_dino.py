# ruff: noqa: UP032, UP045, B007  -- a faithful copy keeps the original's spelling
"""A faithful copy of IDEA-Research/DINO's code that vispe's DINO parts are tested against.

Source: https://github.com/IDEA-Research/DINO at commit faa8520fe9604c23ad65a48bc583550a44c0e3ab
(2023-12-20), Apache-2.0, Copyright (c) 2022 IDEA:

* ``util/misc.py``: ``inverse_sigmoid``; ``util/box_ops.py``: ``box_cxcywh_to_xyxy``, ``box_iou``,
  ``generalized_box_iou``;
* ``models/dino/utils.py``: ``gen_encoder_output_proposals``, ``sigmoid_focal_loss``, ``MLP``,
  ``gen_sineembed_for_position``;
* ``models/dino/dn_components.py``: ``prepare_for_cdn``, ``dn_post_process``;
* ``models/dino/ops``: ``ms_deform_attn_core_pytorch`` and ``MSDeformAttn`` (its forward calls the
  PyTorch core where the original calls the CUDA ``MSDeformAttnFunction``, whose CPU path is that core);
* ``models/dino/deformable_transformer.py``: ``DeformableTransformerDecoderLayer`` (the "sa" path),
  ``TransformerDecoder.forward`` (the look-forward-twice loop), the "standard" two-stage branch of
  ``DeformableTransformer.forward`` (mixed query selection, ``select_standard`` here);
* ``models/dino/dino.py``: the box loop of ``DINO.forward`` (``dino_head_outputs``) and the denoising
  terms of ``SetCriterion.forward`` with ``loss_labels`` / ``loss_boxes`` (``dn_criterion``).

Changes, all mechanical: ``.cuda()`` / ``.to('cuda')`` become the inputs' device; ``torch.range(0, n -
1)`` is ``torch.arange(n)`` (the same values; ``range`` is deprecated); constructors take only the
arguments DINO's 4-scale config uses, with its values; branches for options that config does not
set are dropped where marked; the logging terms (class_error, loss_xy, loss_hw) are left out.
The copy is in three files by concept: ``_reference_dino_utils.py`` (util/, models/dino/utils.py),
``_reference_dino_dn.py`` (dn_components.py, dino.py's head loop and denoising losses) and this one (ops,
deformable_transformer.py), which re-exports the other two's names: ``import _reference_dino as ref`` reaches
every part.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from _reference_dino_dn import (  # noqa: F401  (re-exported: ref.<name>)
    _set_aux_loss,
    dino_head_outputs,
    dn_criterion,
    dn_post_process,
    loss_boxes,
    loss_labels,
    prepare_for_cdn,
)
from _reference_dino_utils import (  # noqa: F401  (re-exported: ref.<name>)
    MLP,
    box_cxcywh_to_xyxy,
    box_iou,
    gen_encoder_output_proposals,
    gen_sineembed_for_position,
    generalized_box_iou,
    inverse_sigmoid,
    sigmoid_focal_loss,
)
from torch import Tensor, nn


# --- models/dino/ops ------------------------------------------------------------------------------
def ms_deform_attn_core_pytorch(value, value_spatial_shapes, sampling_locations, attention_weights):
    N_, S_, M_, D_ = value.shape
    _, Lq_, M_, L_, P_, _ = sampling_locations.shape
    value_list = value.split([H_ * W_ for H_, W_ in value_spatial_shapes], dim=1)
    sampling_grids = 2 * sampling_locations - 1
    sampling_value_list = []
    for lid_, (H_, W_) in enumerate(value_spatial_shapes):
        value_l_ = value_list[lid_].flatten(2).transpose(1, 2).reshape(N_*M_, D_, H_, W_)
        sampling_grid_l_ = sampling_grids[:, :, :, lid_].transpose(1, 2).flatten(0, 1)
        sampling_value_l_ = F.grid_sample(value_l_, sampling_grid_l_,
                                          mode='bilinear', padding_mode='zeros', align_corners=False)
        sampling_value_list.append(sampling_value_l_)
    attention_weights = attention_weights.transpose(1, 2).reshape(N_*M_, 1, Lq_, L_*P_)
    output = (torch.stack(sampling_value_list, dim=-2).flatten(-2) * attention_weights).sum(-1).view(N_, M_*D_, Lq_)
    return output.transpose(1, 2).contiguous()


class MSDeformAttn(nn.Module):
    def __init__(self, d_model=256, n_levels=4, n_heads=8, n_points=4):
        super().__init__()
        self.d_model = d_model
        self.n_levels = n_levels
        self.n_heads = n_heads
        self.n_points = n_points
        self.sampling_offsets = nn.Linear(d_model, n_heads * n_levels * n_points * 2)
        self.attention_weights = nn.Linear(d_model, n_heads * n_levels * n_points)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)

    def forward(self, query, reference_points, input_flatten, input_spatial_shapes, input_level_start_index,
                input_padding_mask=None):
        N, Len_q, _ = query.shape
        N, Len_in, _ = input_flatten.shape
        assert (input_spatial_shapes[:, 0] * input_spatial_shapes[:, 1]).sum() == Len_in

        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask[..., None], float(0))
        value = value.view(N, Len_in, self.n_heads, self.d_model // self.n_heads)
        sampling_offsets = self.sampling_offsets(query).view(N, Len_q, self.n_heads, self.n_levels, self.n_points, 2)
        attention_weights = self.attention_weights(query).view(N, Len_q, self.n_heads, self.n_levels * self.n_points)
        attention_weights = F.softmax(attention_weights, -1).view(N, Len_q, self.n_heads, self.n_levels, self.n_points)
        if reference_points.shape[-1] == 2:
            offset_normalizer = torch.stack([input_spatial_shapes[..., 1], input_spatial_shapes[..., 0]], -1)
            sampling_locations = reference_points[:, :, None, :, None, :] \
                + sampling_offsets / offset_normalizer[None, None, None, :, None, :]
        elif reference_points.shape[-1] == 4:
            sampling_locations = reference_points[:, :, None, :, None, :2] \
                + sampling_offsets / self.n_points * reference_points[:, :, None, :, None, 2:] * 0.5
        else:
            raise ValueError(
                'Last dim of reference_points must be 2 or 4, but get {} instead.'.format(reference_points.shape[-1]))
        output = ms_deform_attn_core_pytorch(value, input_spatial_shapes, sampling_locations, attention_weights)
        output = self.output_proj(output)
        return output


# --- models/dino/deformable_transformer.py ----------------------------------------------------------
class DeformableTransformerDecoderLayer(nn.Module):
    """decoder_sa_type='sa', module_seq=['sa', 'ca', 'ffn'], key_aware_type=None, activation relu."""

    def __init__(self, d_model=256, d_ffn=1024, dropout=0.1, n_levels=4, n_heads=8, n_points=4):
        super().__init__()
        self.cross_attn = MSDeformAttn(d_model, n_levels, n_heads, n_points)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.self_attn = nn.MultiheadAttention(d_model, n_heads, dropout=dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, d_ffn)
        self.activation = F.relu
        self.dropout3 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ffn, d_model)
        self.dropout4 = nn.Dropout(dropout)
        self.norm3 = nn.LayerNorm(d_model)

    @staticmethod
    def with_pos_embed(tensor, pos):
        return tensor if pos is None else tensor + pos

    def forward_ffn(self, tgt):
        tgt2 = self.linear2(self.dropout3(self.activation(self.linear1(tgt))))
        tgt = tgt + self.dropout4(tgt2)
        tgt = self.norm3(tgt)
        return tgt

    def forward(self, tgt, tgt_query_pos=None, tgt_query_sine_embed=None, tgt_key_padding_mask=None,
                tgt_reference_points=None, memory=None, memory_key_padding_mask=None, memory_level_start_index=None,
                memory_spatial_shapes=None, memory_pos=None, self_attn_mask=None, cross_attn_mask=None):
        # forward_sa, decoder_sa_type == 'sa'
        q = k = self.with_pos_embed(tgt, tgt_query_pos)
        tgt2 = self.self_attn(q, k, tgt, attn_mask=self_attn_mask)[0]
        tgt = tgt + self.dropout2(tgt2)
        tgt = self.norm2(tgt)
        # forward_ca
        tgt2 = self.cross_attn(self.with_pos_embed(tgt, tgt_query_pos).transpose(0, 1),
                               tgt_reference_points.transpose(0, 1).contiguous(),
                               memory.transpose(0, 1), memory_spatial_shapes, memory_level_start_index,
                               memory_key_padding_mask).transpose(0, 1)
        tgt = tgt + self.dropout1(tgt2)
        tgt = self.norm1(tgt)
        return self.forward_ffn(tgt)


class TransformerDecoder(nn.Module):
    """deformable_decoder=True, rm_dec_query_scale=True, return_intermediate=True, query_dim=4; the
    perturber, dec_layer_number and dec_layer_dropout_prob are None (their branches dropped)."""

    def __init__(self, layers, norm, d_model=256, query_dim=4, use_detached_boxes_dec_out=False):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.num_layers = len(layers)
        self.norm = norm
        self.query_dim = query_dim
        self.use_detached_boxes_dec_out = use_detached_boxes_dec_out
        self.ref_point_head = MLP(query_dim // 2 * d_model, d_model, d_model, 2)
        self.query_scale = None
        self.bbox_embed = None
        self.class_embed = None
        self.d_model = d_model
        self.deformable_decoder = True
        self.rm_detach = None

    def forward(self, tgt, memory, tgt_mask: Optional[Tensor] = None, memory_mask: Optional[Tensor] = None,
                tgt_key_padding_mask: Optional[Tensor] = None, memory_key_padding_mask: Optional[Tensor] = None,
                pos: Optional[Tensor] = None, refpoints_unsigmoid: Optional[Tensor] = None,
                level_start_index: Optional[Tensor] = None, spatial_shapes: Optional[Tensor] = None,
                valid_ratios: Optional[Tensor] = None):
        output = tgt

        intermediate = []
        reference_points = refpoints_unsigmoid.sigmoid()
        ref_points = [reference_points]

        for layer_id, layer in enumerate(self.layers):
            if self.deformable_decoder:
                if reference_points.shape[-1] == 4:
                    reference_points_input = reference_points[:, :, None] \
                        * torch.cat([valid_ratios, valid_ratios], -1)[None, :]  # nq, bs, nlevel, 4
                else:
                    assert reference_points.shape[-1] == 2
                    reference_points_input = reference_points[:, :, None] * valid_ratios[None, :]
                query_sine_embed = gen_sineembed_for_position(reference_points_input[:, :, 0, :])  # nq, bs, 256*2
            else:
                query_sine_embed = gen_sineembed_for_position(reference_points)  # nq, bs, 256*2
                reference_points_input = None

            # conditional query
            raw_query_pos = self.ref_point_head(query_sine_embed)  # nq, bs, 256
            pos_scale = self.query_scale(output) if self.query_scale is not None else 1
            query_pos = pos_scale * raw_query_pos

            output = layer(
                tgt=output,
                tgt_query_pos=query_pos,
                tgt_query_sine_embed=query_sine_embed,
                tgt_key_padding_mask=tgt_key_padding_mask,
                tgt_reference_points=reference_points_input,

                memory=memory,
                memory_key_padding_mask=memory_key_padding_mask,
                memory_level_start_index=level_start_index,
                memory_spatial_shapes=spatial_shapes,
                memory_pos=pos,

                self_attn_mask=tgt_mask,
                cross_attn_mask=memory_mask
            )

            # iter update
            if self.bbox_embed is not None:
                reference_before_sigmoid = inverse_sigmoid(reference_points)
                delta_unsig = self.bbox_embed[layer_id](output)
                outputs_unsig = delta_unsig + reference_before_sigmoid
                new_reference_points = outputs_unsig.sigmoid()

                if self.rm_detach and 'dec' in self.rm_detach:
                    reference_points = new_reference_points
                else:
                    reference_points = new_reference_points.detach()
                if self.use_detached_boxes_dec_out:
                    ref_points.append(reference_points)
                else:
                    ref_points.append(new_reference_points)

            intermediate.append(self.norm(output))

        return [
            [itm_out.transpose(0, 1) for itm_out in intermediate],
            [itm_refpoint.transpose(0, 1) for itm_refpoint in ref_points]
        ]


def select_standard(self, memory, mask_flatten, spatial_shapes, refpoint_embed=None, tgt=None):
    """DeformableTransformer.forward's two_stage_type == 'standard' branch (two_stage_learn_wh=False,
    two_stage_pat_embed=0, two_stage_add_query_num=0, embed_init_tgt=True); ``self`` holds enc_output,
    enc_output_norm, enc_out_class_embed, enc_out_bbox_embed, num_queries, d_model, tgt_embed. Returns
    (refpoint_embed, tgt, hs_enc, ref_enc) as the forward has them before and after the decoder."""
    bs = memory.shape[0]
    input_hw = None
    output_memory, output_proposals = gen_encoder_output_proposals(memory, mask_flatten, spatial_shapes, input_hw)
    output_memory = self.enc_output_norm(self.enc_output(output_memory))

    enc_outputs_class_unselected = self.enc_out_class_embed(output_memory)
    enc_outputs_coord_unselected = self.enc_out_bbox_embed(output_memory) + output_proposals  # (bs, \sum{hw}, 4) unsigmoid
    topk = self.num_queries
    topk_proposals = torch.topk(enc_outputs_class_unselected.max(-1)[0], topk, dim=1)[1]  # bs, nq

    # gather boxes
    refpoint_embed_undetach = torch.gather(enc_outputs_coord_unselected, 1, topk_proposals.unsqueeze(-1).repeat(1, 1, 4))  # unsigmoid
    refpoint_embed_ = refpoint_embed_undetach.detach()

    # gather tgt
    tgt_undetach = torch.gather(output_memory, 1, topk_proposals.unsqueeze(-1).repeat(1, 1, self.d_model))
    tgt_ = self.tgt_embed.weight[:, None, :].repeat(1, bs, 1).transpose(0, 1)  # nq, bs, d_model

    if refpoint_embed is not None:
        refpoint_embed = torch.cat([refpoint_embed, refpoint_embed_], dim=1)
        tgt = torch.cat([tgt, tgt_], dim=1)
    else:
        refpoint_embed, tgt = refpoint_embed_, tgt_
    hs_enc = tgt_undetach.unsqueeze(0)
    ref_enc = refpoint_embed_undetach.sigmoid().unsqueeze(0)
    return refpoint_embed, tgt, hs_enc, ref_enc
