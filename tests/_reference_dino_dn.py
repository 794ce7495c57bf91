# ruff: noqa: UP032, UP045, B007  -- a faithful copy keeps the original's spelling
"""Part of the faithful copy of IDEA-Research/DINO's code (tests/_reference_dino.py says what and how):
the denoising queries and their losses.

Source: https://github.com/IDEA-Research/DINO at commit faa8520fe9604c23ad65a48bc583550a44c0e3ab
(2023-12-20), Apache-2.0, Copyright (c) 2022 IDEA:

* ``models/dino/dn_components.py``: ``prepare_for_cdn``, ``dn_post_process``;
* ``models/dino/dino.py``: the box loop of ``DINO.forward`` (``dino_head_outputs``) and the denoising
  terms of ``SetCriterion.forward`` with ``loss_labels`` / ``loss_boxes`` (``dn_criterion``).
"""
import torch
import torch.nn.functional as F
from _reference_dino_utils import box_cxcywh_to_xyxy, generalized_box_iou, inverse_sigmoid, sigmoid_focal_loss


# --- models/dino/dn_components.py -------------------------------------------------------------------
def prepare_for_cdn(dn_args, training, num_queries, num_classes, hidden_dim, label_enc):
    if training:
        targets, dn_number, label_noise_ratio, box_noise_scale = dn_args
        device = label_enc.weight.device
        # positive and negative dn queries
        dn_number = dn_number * 2
        known = [(torch.ones_like(t['labels'])).to(device) for t in targets]
        batch_size = len(known)
        known_num = [sum(k) for k in known]
        if int(max(known_num)) == 0:
            dn_number = 1
        else:
            if dn_number >= 100:
                dn_number = dn_number // (int(max(known_num) * 2))
            elif dn_number < 1:
                dn_number = 1
        if dn_number == 0:
            dn_number = 1
        unmask_bbox = unmask_label = torch.cat(known)
        labels = torch.cat([t['labels'] for t in targets])
        boxes = torch.cat([t['boxes'] for t in targets])
        batch_idx = torch.cat([torch.full_like(t['labels'].long(), i) for i, t in enumerate(targets)])

        known_indice = torch.nonzero(unmask_label + unmask_bbox)
        known_indice = known_indice.view(-1)

        known_indice = known_indice.repeat(2 * dn_number, 1).view(-1)
        known_labels = labels.repeat(2 * dn_number, 1).view(-1)
        known_bid = batch_idx.repeat(2 * dn_number, 1).view(-1)
        known_bboxs = boxes.repeat(2 * dn_number, 1)
        known_labels_expaned = known_labels.clone()
        known_bbox_expand = known_bboxs.clone()

        if label_noise_ratio > 0:
            p = torch.rand_like(known_labels_expaned.float())
            chosen_indice = torch.nonzero(p < (label_noise_ratio * 0.5)).view(-1)  # half of bbox prob
            new_label = torch.randint_like(chosen_indice, 0, num_classes)  # randomly put a new one here
            known_labels_expaned.scatter_(0, chosen_indice, new_label)
        single_pad = int(max(known_num))

        pad_size = int(single_pad * 2 * dn_number)
        positive_idx = torch.tensor(range(len(boxes))).long().to(device).unsqueeze(0).repeat(dn_number, 1)
        positive_idx += (torch.tensor(range(dn_number)) * len(boxes) * 2).long().to(device).unsqueeze(1)
        positive_idx = positive_idx.flatten()
        negative_idx = positive_idx + len(boxes)
        if box_noise_scale > 0:
            known_bbox_ = torch.zeros_like(known_bboxs)
            known_bbox_[:, :2] = known_bboxs[:, :2] - known_bboxs[:, 2:] / 2
            known_bbox_[:, 2:] = known_bboxs[:, :2] + known_bboxs[:, 2:] / 2

            diff = torch.zeros_like(known_bboxs)
            diff[:, :2] = known_bboxs[:, 2:] / 2
            diff[:, 2:] = known_bboxs[:, 2:] / 2

            rand_sign = torch.randint_like(known_bboxs, low=0, high=2, dtype=torch.float32) * 2.0 - 1.0
            rand_part = torch.rand_like(known_bboxs)
            rand_part[negative_idx] += 1.0
            rand_part *= rand_sign
            known_bbox_ = known_bbox_ + torch.mul(rand_part,
                                                  diff).to(device) * box_noise_scale
            known_bbox_ = known_bbox_.clamp(min=0.0, max=1.0)
            known_bbox_expand[:, :2] = (known_bbox_[:, :2] + known_bbox_[:, 2:]) / 2
            known_bbox_expand[:, 2:] = known_bbox_[:, 2:] - known_bbox_[:, :2]

        m = known_labels_expaned.long().to(device)
        input_label_embed = label_enc(m)
        input_bbox_embed = inverse_sigmoid(known_bbox_expand)

        padding_label = torch.zeros(pad_size, hidden_dim).to(device)
        padding_bbox = torch.zeros(pad_size, 4).to(device)

        input_query_label = padding_label.repeat(batch_size, 1, 1)
        input_query_bbox = padding_bbox.repeat(batch_size, 1, 1)

        map_known_indice = torch.tensor([]).to(device)
        if len(known_num):
            map_known_indice = torch.cat([torch.tensor(range(num)) for num in known_num])  # [1,2, 1,2,3]
            map_known_indice = torch.cat([map_known_indice + single_pad * i for i in range(2 * dn_number)]).long()
        if len(known_bid):
            input_query_label[(known_bid.long(), map_known_indice)] = input_label_embed
            input_query_bbox[(known_bid.long(), map_known_indice)] = input_bbox_embed

        tgt_size = pad_size + num_queries
        attn_mask = torch.ones(tgt_size, tgt_size).to(device) < 0
        # match query cannot see the reconstruct
        attn_mask[pad_size:, :pad_size] = True
        # reconstruct cannot see each other
        for i in range(dn_number):
            if i == 0:
                attn_mask[single_pad * 2 * i:single_pad * 2 * (i + 1), single_pad * 2 * (i + 1):pad_size] = True
            if i == dn_number - 1:
                attn_mask[single_pad * 2 * i:single_pad * 2 * (i + 1), :single_pad * i * 2] = True
            else:
                attn_mask[single_pad * 2 * i:single_pad * 2 * (i + 1), single_pad * 2 * (i + 1):pad_size] = True
                attn_mask[single_pad * 2 * i:single_pad * 2 * (i + 1), :single_pad * 2 * i] = True

        dn_meta = {
            'pad_size': pad_size,
            'num_dn_group': dn_number,
        }
    else:
        input_query_label = None
        input_query_bbox = None
        attn_mask = None
        dn_meta = None

    return input_query_label, input_query_bbox, attn_mask, dn_meta


def dn_post_process(outputs_class, outputs_coord, dn_meta, aux_loss, _set_aux_loss):
    if dn_meta and dn_meta['pad_size'] > 0:
        output_known_class = outputs_class[:, :, :dn_meta['pad_size'], :]
        output_known_coord = outputs_coord[:, :, :dn_meta['pad_size'], :]
        outputs_class = outputs_class[:, :, dn_meta['pad_size']:, :]
        outputs_coord = outputs_coord[:, :, dn_meta['pad_size']:, :]
        out = {'pred_logits': output_known_class[-1], 'pred_boxes': output_known_coord[-1]}
        if aux_loss:
            out['aux_outputs'] = _set_aux_loss(output_known_class, output_known_coord)
        dn_meta['output_known_lbs_bboxes'] = out
    return outputs_class, outputs_coord


def _set_aux_loss(outputs_class, outputs_coord):  # DINO._set_aux_loss
    return [{'pred_logits': a, 'pred_boxes': b}
            for a, b in zip(outputs_class[:-1], outputs_coord[:-1])]


# --- models/dino/dino.py ----------------------------------------------------------------------------
def dino_head_outputs(hs, reference, bbox_embed, class_embed, dn_meta, aux_loss=True, dn_number=100):
    """DINO.forward after the transformer: the box loop, dn_post_process, the output dict."""
    outputs_coord_list = []
    for dec_lid, (layer_ref_sig, layer_bbox_embed, layer_hs) in enumerate(zip(reference[:-1], bbox_embed, hs)):
        layer_delta_unsig = layer_bbox_embed(layer_hs)
        layer_outputs_unsig = layer_delta_unsig + inverse_sigmoid(layer_ref_sig)
        layer_outputs_unsig = layer_outputs_unsig.sigmoid()
        outputs_coord_list.append(layer_outputs_unsig)
    outputs_coord_list = torch.stack(outputs_coord_list)

    outputs_class = torch.stack([layer_cls_embed(layer_hs) for
                                 layer_cls_embed, layer_hs in zip(class_embed, hs)])
    if dn_number > 0 and dn_meta is not None:
        outputs_class, outputs_coord_list = \
            dn_post_process(outputs_class, outputs_coord_list,
                            dn_meta, aux_loss, _set_aux_loss)
    out = {'pred_logits': outputs_class[-1], 'pred_boxes': outputs_coord_list[-1]}
    if aux_loss:
        out['aux_outputs'] = _set_aux_loss(outputs_class, outputs_coord_list)
    out['dn_meta'] = dn_meta
    return out


def _src_idx(indices):  # SetCriterion._get_src_permutation_idx
    batch_idx = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
    src_idx = torch.cat([src for (src, _) in indices])
    return batch_idx, src_idx


def loss_labels(outputs, targets, indices, num_boxes, num_classes, focal_alpha=0.25):
    src_logits = outputs['pred_logits']
    idx = _src_idx(indices)
    target_classes_o = torch.cat([t["labels"][J] for t, (_, J) in zip(targets, indices)])
    target_classes = torch.full(src_logits.shape[:2], num_classes,
                                dtype=torch.int64, device=src_logits.device)
    target_classes[idx] = target_classes_o
    target_classes_onehot = torch.zeros([src_logits.shape[0], src_logits.shape[1], src_logits.shape[2]+1],
                                        dtype=src_logits.dtype, layout=src_logits.layout, device=src_logits.device)
    target_classes_onehot.scatter_(2, target_classes.unsqueeze(-1), 1)
    target_classes_onehot = target_classes_onehot[:, :, :-1]
    loss_ce = sigmoid_focal_loss(src_logits, target_classes_onehot, num_boxes, alpha=focal_alpha, gamma=2) \
        * src_logits.shape[1]
    return {'loss_ce': loss_ce}


def loss_boxes(outputs, targets, indices, num_boxes):
    idx = _src_idx(indices)
    src_boxes = outputs['pred_boxes'][idx]
    target_boxes = torch.cat([t['boxes'][i] for t, (_, i) in zip(targets, indices)], dim=0)
    loss_bbox = F.l1_loss(src_boxes, target_boxes, reduction='none')
    losses = {}
    losses['loss_bbox'] = loss_bbox.sum() / num_boxes
    loss_giou = 1 - torch.diag(generalized_box_iou(
        box_cxcywh_to_xyxy(src_boxes),
        box_cxcywh_to_xyxy(target_boxes)))
    losses['loss_giou'] = loss_giou.sum() / num_boxes
    return losses


def dn_criterion(outputs, targets, num_classes, focal_alpha=0.25):
    """The denoising terms of SetCriterion.forward (training, dn_meta with output_known_lbs_bboxes),
    losses = ['labels', 'boxes'], world size 1."""
    device = outputs['pred_logits'].device
    num_boxes = sum(len(t["labels"]) for t in targets)
    num_boxes = torch.as_tensor([num_boxes], dtype=torch.float, device=device)
    num_boxes = torch.clamp(num_boxes, min=1).item()
    losses = {}
    dn_meta = outputs['dn_meta']
    # prep_for_dn
    output_known_lbs_bboxes = dn_meta['output_known_lbs_bboxes']
    num_dn_groups, pad_size = dn_meta['num_dn_group'], dn_meta['pad_size']
    assert pad_size % num_dn_groups == 0
    single_pad = pad_size // num_dn_groups
    scalar = num_dn_groups

    dn_pos_idx = []
    dn_neg_idx = []
    for i in range(len(targets)):
        if len(targets[i]['labels']) > 0:
            t = torch.arange(len(targets[i]['labels'])).long().to(device)
            t = t.unsqueeze(0).repeat(scalar, 1)
            tgt_idx = t.flatten()
            output_idx = (torch.tensor(range(scalar)) * single_pad).long().to(device).unsqueeze(1) + t
            output_idx = output_idx.flatten()
        else:
            output_idx = tgt_idx = torch.tensor([]).long().to(device)
        dn_pos_idx.append((output_idx, tgt_idx))
        dn_neg_idx.append((output_idx + single_pad // 2, tgt_idx))

    l_dict = {}
    l_dict.update(loss_labels(output_known_lbs_bboxes, targets, dn_pos_idx, num_boxes*scalar, num_classes, focal_alpha))
    l_dict.update(loss_boxes(output_known_lbs_bboxes, targets, dn_pos_idx, num_boxes*scalar))
    losses.update({k + '_dn': v for k, v in l_dict.items()})
    for idx, _ in enumerate(outputs['aux_outputs']):
        aux_outputs_known = output_known_lbs_bboxes['aux_outputs'][idx]
        l_dict = {}
        l_dict.update(loss_labels(aux_outputs_known, targets, dn_pos_idx, num_boxes*scalar, num_classes, focal_alpha))
        l_dict.update(loss_boxes(aux_outputs_known, targets, dn_pos_idx, num_boxes*scalar))
        losses.update({k + f'_dn_{idx}': v for k, v in l_dict.items()})
    return losses
