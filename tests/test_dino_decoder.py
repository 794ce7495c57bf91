"""DINO's query selection and decoder loop (vispe.models.detr.queries.dn) against a faithful copy of
IDEA-Research/DINO (tests/_reference_dino.py): the same weights and the same seeded denoising draws
through mixed query selection, the denoising groups, the decoder with look-forward-twice, the heads,
dn_post_process and the denoising losses; outputs and gradients within 1e-5."""
import copy

import _reference_dino as ref
import pytest
import torch
from torch import nn

from vispe.coords import points_at_levels, valid_ratios
from vispe.kernels.deformable import Levels, swap_xy
from vispe.models.detr.load.deformable_keys import deformable_keys
from vispe.models.detr.queries.dn import (
    DinoQueryPos,
    MixedQuerySelection,
    denoising_losses,
    dn_post_process,
    layer_boxes,
    look_forward_twice,
    prepare_cdn,
)
from vispe.models.detr.queries.positioned import build_anchor_pe
from vispe.models.detr.transformer.deformable_decoder import DeformableDecoderLayer, encoder_proposals

D, HEADS, FFN, POINTS, LAYERS, Q, K = 256, 8, 64, 2, 3, 10, 5  # D 256: the reference's sine has 128 per coordinate
SHAPES = ((6, 8), (3, 4))
DN = 3  # dn_number: 2 * 3 = 6 groups (the reference doubles it below 50)


def perturb(module, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 / p.shape[-1] ** 0.5 if p.dim() > 1 else 0.2))
            if "norm" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5, generator=g)
    return module


class Reference(nn.Module):
    """The reference's modules (DINO's names), one decoder of LAYERS layers with shared heads."""

    def __init__(self, use_detached_boxes_dec_out=False):
        super().__init__()
        layers = [ref.DeformableTransformerDecoderLayer(D, FFN, 0.0, len(SHAPES), HEADS, POINTS) for _ in range(LAYERS)]
        self.decoder = ref.TransformerDecoder(layers, nn.LayerNorm(D), D,
                                              use_detached_boxes_dec_out=use_detached_boxes_dec_out)
        box, cls = ref.MLP(D, D, 4, 3), nn.Linear(D, K)
        self.bbox_embed, self.class_embed = nn.ModuleList([box] * LAYERS), nn.ModuleList([cls] * LAYERS)
        self.decoder.bbox_embed, self.decoder.class_embed = self.bbox_embed, self.class_embed
        self.enc_output, self.enc_output_norm = nn.Linear(D, D), nn.LayerNorm(D)
        self.enc_out_class_embed, self.enc_out_bbox_embed = nn.Linear(D, K), ref.MLP(D, D, 4, 3)
        self.tgt_embed, self.label_enc = nn.Embedding(Q, D), nn.Embedding(K + 1, D)
        self.num_queries, self.d_model = Q, D
        perturb(self, 0)


class Ours(nn.Module):
    def __init__(self, r: Reference):
        super().__init__()
        self.layers = nn.ModuleList([DeformableDecoderLayer(D, HEADS, FFN, 0.0, num_levels=len(SHAPES),
                                                            num_points=POINTS) for _ in range(LAYERS)])
        renamed, rest = deformable_keys({f"transformer.decoder.layers.{i}." + k: v for i, layer in
                                         enumerate(r.decoder.layers) for k, v in layer.state_dict().items()},
                                        "official", decoder="")
        assert not rest
        self.layers.load_state_dict(renamed)
        self.norm = copy.deepcopy(r.decoder.norm)
        self.query_pos = DinoQueryPos(D, build_anchor_pe("sine", {}, D))
        self.query_pos.ref_point_head.load_state_dict(r.decoder.ref_point_head.state_dict())
        self.box, self.cls = copy.deepcopy(r.bbox_embed[0]), copy.deepcopy(r.class_embed[0])
        self.select = MixedQuerySelection(D, Q, select="all")  # the reference's: no padding here, the same
        for name in ("enc_output", "enc_output_norm", "tgt_embed"):
            getattr(self.select, name).load_state_dict(getattr(r, name).state_dict())
        self.enc_cls, self.enc_box = copy.deepcopy(r.enc_out_class_embed), copy.deepcopy(r.enc_out_bbox_embed)
        self.label_enc = copy.deepcopy(r.label_enc)


def targets_for(counts, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in counts:
        c, wh = torch.rand(n, 2, generator=g) * 0.5 + 0.25, torch.rand(n, 2, generator=g) * 0.3 + 0.05
        out.append({"boxes": torch.cat([c, wh], -1), "labels": torch.randint(0, K, (n,), generator=g)})
    return out


def run_reference(r: Reference, memory, targets, seed, dn=True):
    B, N, _ = memory.shape
    mask = torch.zeros(B, N, dtype=torch.bool)
    shapes = torch.tensor(SHAPES)
    start = torch.tensor([0, SHAPES[0][0] * SHAPES[0][1]])
    ratios = torch.ones(B, len(SHAPES), 2)
    label = box = attn_mask = meta = None
    if dn:
        torch.manual_seed(seed)
        label, box, attn_mask, meta = ref.prepare_for_cdn((targets, DN, 0.5, 1.0), True, Q, K, D, r.label_enc)
    refpoints, tgt, hs_enc, ref_enc = ref.select_standard(r, memory, mask, shapes, box, label)
    hs, references = r.decoder(tgt.transpose(0, 1), memory.transpose(0, 1), tgt_mask=attn_mask,
                               memory_key_padding_mask=mask, refpoints_unsigmoid=refpoints.transpose(0, 1),
                               level_start_index=start, spatial_shapes=shapes, valid_ratios=ratios)
    hs[0] += r.label_enc.weight[0, 0] * 0.0
    out = ref.dino_head_outputs(hs, references, r.bbox_embed, r.class_embed, meta)
    out["interm_outputs"] = {"pred_logits": r.enc_out_class_embed(hs_enc[-1]), "pred_boxes": ref_enc[-1]}
    return out


def run_ours(o: Ours, memory, targets, seed, dn=True, look_twice=True, heads=None):
    B = memory.shape[0]
    levels = Levels(SHAPES)
    ratios = torch.ones(B, len(SHAPES), 2)
    zeroed, proposals = encoder_proposals(memory, None, levels)
    content, anchors, enc = o.select(zeroed, proposals, o.enc_cls, o.enc_box)  # (B, Q, d), (B, Q, 4) logits
    groups = None
    if dn:
        groups = prepare_cdn(targets, o.label_enc, num_queries=Q, num_classes=K, dn_number=DN,
                             label_noise_ratio=0.5, box_noise_scale=1.0, generator=torch.Generator().manual_seed(seed))
        content, anchors = torch.cat([groups.content, content], 1), torch.cat([groups.box_logits, anchors], 1)
    allowed = None if groups is None else ~groups.attn_mask

    def layer(i, t, boxes):
        reference = points_at_levels(swap_xy(boxes), ratios)  # (B, T, L, 4) (cy, cx, h, w)
        return o.layers[i](t, o.query_pos(boxes), reference, memory, levels, None, self_attn_mask=allowed)

    heads = heads or [o.box] * LAYERS
    hs, refs = look_forward_twice(content, anchors.sigmoid(), layer, LAYERS, heads, o.norm,
                                  look_forward_twice=look_twice)
    logits = torch.stack([o.cls(h) for h in hs])  # (L, B, T, K)
    logits, boxes, dn_out = dn_post_process(logits, layer_boxes(hs, refs, heads), groups.pad_size if groups else 0)
    return logits, boxes, dn_out, enc, groups


def close(a, b, what):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=what)


@pytest.mark.parametrize("counts", [[3, 2], [4, 0]])
def test_dino_decoder_equals_the_reference(counts):
    r = Reference()
    o = Ours(r)
    memory = torch.randn(2, sum(h * w for h, w in SHAPES), D, generator=torch.Generator().manual_seed(5))
    targets = targets_for(counts)
    want = run_reference(r, memory, targets, seed=7)
    logits, boxes, dn, enc, groups = run_ours(o, memory, targets, seed=7)
    assert want["pred_boxes"].std() > 0.05 and want["pred_logits"].std() > 0.1  # not a degenerate case
    close(logits[-1], want["pred_logits"], "pred_logits")
    close(boxes[-1], want["pred_boxes"], "pred_boxes")
    for i, aux in enumerate(want["aux_outputs"]):
        close(logits[i], aux["pred_logits"], f"aux {i} logits")
        close(boxes[i], aux["pred_boxes"], f"aux {i} boxes")
    known = want["dn_meta"]["output_known_lbs_bboxes"]
    close(dn["pred_logits"], known["pred_logits"], "dn logits")
    close(dn["pred_boxes"], known["pred_boxes"], "dn boxes")
    for a, w in zip(dn["aux_outputs"], known["aux_outputs"]):
        close(a["pred_boxes"], w["pred_boxes"], "dn aux boxes")
    close(enc["pred_logits"], want["interm_outputs"]["pred_logits"], "interm logits")
    close(enc["pred_boxes"], want["interm_outputs"]["pred_boxes"], "interm boxes")
    # the losses and every gradient they give the shared pieces
    want_loss = ref.dn_criterion(want, targets, K)
    got_loss = denoising_losses(dn, targets, num_groups=groups.num_groups, single_pad=groups.single_pad,
                                num_boxes=max(sum(counts), 1))
    for k in want_loss:
        close(got_loss[k], want_loss[k].reshape(()), k)
    probe = torch.randn(boxes.shape[1:], generator=torch.Generator().manual_seed(9))  # (B, Q, 4)
    (sum(v.sum() for v in want_loss.values()) + (want["pred_boxes"] * probe).sum()
     + sum((a["pred_boxes"] * probe).sum() for a in want["aux_outputs"])
     + want["interm_outputs"]["pred_boxes"].sum() + want["pred_logits"].sum()).backward()
    (sum(got_loss.values()) + (boxes * probe).sum() + enc["pred_boxes"].sum() + logits[-1].sum()).backward()
    pairs = [(o.box, r.bbox_embed[0]), (o.cls, r.class_embed[0]), (o.query_pos.ref_point_head, r.decoder.ref_point_head),
             (o.label_enc, r.label_enc), (o.select.tgt_embed, r.tgt_embed), (o.select.enc_output, r.enc_output),
             (o.enc_box, r.enc_out_bbox_embed), (o.norm, r.decoder.norm),
             (o.layers[0].cross_attn, r.decoder.layers[0].cross_attn), (o.layers[0].norm1, r.decoder.layers[0].norm2)]
    for ours, theirs in pairs:
        for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
            assert q.grad is not None and q.grad.abs().max() > 0, (type(theirs).__name__, name)
            # float32 sums over many terms in another order: relative to the gradient's size
            scale = q.grad.abs().max()
            torch.testing.assert_close(p.grad / scale, q.grad / scale, rtol=0, atol=2e-5,
                                       msg=f"grad {type(theirs).__name__}.{name}")


def test_look_forward_once_equals_the_references_detached_boxes():
    r = Reference(use_detached_boxes_dec_out=True)
    o = Ours(r)
    memory = torch.randn(2, sum(h * w for h, w in SHAPES), D, generator=torch.Generator().manual_seed(5))
    targets = targets_for([2, 3])
    want = run_reference(r, memory, targets, seed=3)
    logits, boxes, dn, enc, groups = run_ours(o, memory, targets, seed=3, look_twice=False)
    close(boxes[-1], want["pred_boxes"], "pred_boxes")
    close(dn["pred_boxes"], want["dn_meta"]["output_known_lbs_bboxes"]["pred_boxes"], "dn boxes")
    # look-forward-twice: layer 1's box reaches layer 0's box head through its reference; once: it does not
    heads = [copy.deepcopy(o.box) for _ in range(LAYERS)]  # one per layer, so that the paths are apart
    for twice in (True, False):
        boxes = run_ours(o, memory, targets, seed=3, look_twice=twice, heads=heads)[1]  # (L, B, Q, 4)
        for h in heads:
            h.zero_grad(set_to_none=True)
        boxes[1].sum().backward()
        g = heads[0].layers[2].weight.grad
        assert g.abs().max() > 1e-3 if twice else g is None or not g.any()  # (zeros: through the stack of layers)
        assert heads[1].layers[2].weight.grad.abs().max() > 1e-3


def test_matching_outputs_do_not_depend_on_the_denoising_groups():
    r = Reference()
    o = Ours(r).eval()
    memory = torch.randn(2, sum(h * w for h, w in SHAPES), D, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        with_dn = run_ours(o, memory, targets_for([3, 1]), seed=1)
        without = run_ours(o, memory, None, seed=1, dn=False)
    assert with_dn[2] is not None and without[2] is None
    torch.testing.assert_close(with_dn[0], without[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(with_dn[1], without[1], rtol=0, atol=1e-5)


def test_valid_selection_skips_tokens_without_a_proposal():
    sel = MixedQuerySelection(D, 3, select="valid")
    memory = torch.randn(1, 6, D)
    proposals = torch.zeros(1, 6, 4)
    proposals[0, :3] = float("inf")  # tokens 0-2 have no proposal
    cls = nn.Linear(D, K)
    with torch.no_grad():
        cls.bias.fill_(0.0)
        cls.weight.zero_()
        cls.bias[0] = 1.0
    _, anchors, enc = sel(memory, proposals, cls, nn.Linear(D, 4))
    assert torch.isfinite(anchors).all()  # the selected are tokens 3-5
    _, anchors_all, _ = MixedQuerySelection(D, 6, select="all")(memory, proposals, cls, nn.Linear(D, 4))
    assert not torch.isfinite(anchors_all).all()
    with pytest.raises(ValueError, match="select"):
        MixedQuerySelection(D, 3, select="best")
    with pytest.raises(ValueError, match="num_queries=7"):
        MixedQuerySelection(D, 7)(memory, proposals, cls, nn.Linear(D, 4))


def test_an_image_alone_equals_it_padded_in_a_batch():
    """Selection ("valid"), positional queries (boxes in units of the valid area) and the loop with
    deformable sampling in the valid area: the padded image's outputs are the image's alone."""
    d, alone_shapes, canvas_shapes = 64, ((6, 8), (3, 4)), ((8, 11), (4, 6))
    g = torch.Generator().manual_seed(0)
    layers = nn.ModuleList([perturb(DeformableDecoderLayer(d, 4, 32, 0.0, num_levels=2, num_points=2), i)
                            for i in range(2)]).eval()
    qp = perturb(DinoQueryPos(d, build_anchor_pe("sine", {}, d)), 5)
    sel = perturb(MixedQuerySelection(d, 6), 6)
    cls, box, norm = perturb(nn.Linear(d, K), 7), perturb(ref.MLP(d, d, 4, 3), 8), nn.LayerNorm(d)
    maps = [torch.randn(1, d, h, w, generator=g) for h, w in alone_shapes]
    canvas = [torch.randn(2, d, h, w, generator=g) for h, w in canvas_shapes]
    masks = [torch.zeros(2, h, w, dtype=torch.bool) for h, w in canvas_shapes]
    for m, c, k in zip(maps, canvas, masks):
        h, w = m.shape[-2:]
        c[0, :, :h, :w] = m[0]
        k[0] = True
        k[0, :h, :w] = False

    def run(level_maps, level_masks):
        levels = Levels.of(level_maps)
        memory = levels.flatten(level_maps)  # (B, N, d)
        pad = levels.flatten(level_masks) if level_masks else None
        ratios = valid_ratios(level_masks) if level_masks else torch.ones(memory.shape[0], 2, 2)
        zeroed, proposals = encoder_proposals(memory, pad, levels)
        content, anchors, enc = sel(zeroed, proposals, cls, box)

        def layer(i, t, boxes):
            return layers[i](t, qp(boxes), points_at_levels(swap_xy(boxes), ratios), memory, levels, pad)

        hs, refs = look_forward_twice(content, anchors.sigmoid(), layer, 2, [box, box], norm)
        return torch.stack([cls(h) for h in hs]), layer_boxes(hs, refs, [box, box]), enc["pred_boxes"]

    with torch.no_grad():
        want, got = run(maps, None), run(canvas, masks)
    for w, o in zip(want, got):
        torch.testing.assert_close(o[..., :1, :, :] if o.dim() == 4 else o[:1], w, rtol=0, atol=1e-4)
    assert not torch.allclose(got[1][:, 1], got[1][:, 0], atol=1e-2)  # the other image differs
