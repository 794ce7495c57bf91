"""vispe's DETR with any encoding: placement rules, padded-batch invariance, criterion, bad input."""
import pytest
import torch

import vispe
from vispe.models.detr import SetCriterion, create_detr
from vispe.models.detr.backbone.cnn import SmallCNN

SMALL = dict(backbone="small_cnn", backbone_widths=(8, 16, 16, 32), d_model=32, nheads=4, enc_layers=1,
             dec_layers=2, dim_feedforward=64, num_queries=6, dropout=0.0)


def small(pe="sine", **kw):
    torch.manual_seed(0)
    return create_detr(4, **{**SMALL, "pe": pe, **kw}).eval()


# --- where position goes -------------------------------------------------------------------------
TABLE3 = {  # DETR's Table 3 rows: (pe, pe_at, query_pos_at)
    "none": ("none", "attn", "attn"),
    "sine at input": ("sine", "input", "input"),
    "learned at attn": ("learned_rowcol", "attn", "attn"),
    "decoder only": ("sine", {"encoder": "none", "decoder": "attn"}, "attn"),
    "sine at attn (default)": ("sine", "attn", "attn"),
}


@pytest.mark.parametrize("row", list(TABLE3))
def test_detr_table3_rows_build_and_run(row):
    pe, pe_at, qpos = TABLE3[row]
    model = small(pe, pe_at=pe_at, query_pos_at=qpos)
    with torch.no_grad():
        out = model(torch.randn(1, 3, 64, 96))
    assert out["pred_logits"].shape == (1, 6, 5) and out["pred_boxes"].shape == (1, 6, 4)
    assert len(out["aux_outputs"]) == 1 and torch.isfinite(out["pred_logits"]).all()
    enc, dec = model.placement.encoder, model.placement.decoder
    assert (enc, dec) == ((pe_at, pe_at) if isinstance(pe_at, str) else (pe_at["encoder"], pe_at["decoder"]))


@pytest.mark.parametrize("pe_at, query_pos_at", [("attn", "attn"), ("input", "input"),
                                                  ({"encoder": "none", "decoder": "attn"}, "attn"),
                                                  ({"encoder": "attn", "decoder": "input"}, "attn")])
def test_placement_equals_a_hand_written_detr_forward(pe_at, query_pos_at):
    """Where the code goes, checked against the layers called by hand with the positions placed explicitly."""
    from vispe.attention import PosContext
    from vispe.models.detr.queries.positioned import LayerPositions

    model = small("sine", pe_at=pe_at, query_pos_at=query_pos_at)
    pl = model.placement
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        out = model(x)
        feats, _ = model.backbone(x, torch.zeros(2, 64, 96, dtype=torch.bool))
        f = model.input_proj(feats)  # (B, d, h, w)
        h, w = f.shape[-2:]
        pos = model.pe((h, w)).expand(2, -1, -1)  # (B, N, d)
        tok = f.flatten(2).transpose(1, 2)
        src = tok + pos if pl.encoder == "input" else tok
        for layer in model.transformer.encoder:
            src = layer(src, PosContext((h, w), pos=pos if pl.encoder == "attn" else None))
        mem = src + pos if pl.decoder == "input" else src
        qpos = model.query_embed.weight[None].expand(2, -1, -1)
        t = torch.zeros_like(qpos) if pl.queries == "attn" else qpos
        for layer in model.transformer.decoder:
            query_ctx = PosContext(pos=qpos if pl.queries == "attn" else None)
            t = layer(t, LayerPositions(query_ctx, query_ctx, PosContext((h, w), pos=pos if pl.decoder == "attn" else None)),
                      mem)
        logits = model.class_embed(model.transformer.decoder_norm(t))
    torch.testing.assert_close(out["pred_logits"], logits, rtol=1e-5, atol=1e-5)


def test_memory_permutation_invariance_exactly_without_position():
    """Without position the decoder output does not depend on the order of the memory tokens."""
    for pe, expect_invariant in (("none", True), ("sine", False)):
        model = small(pe)
        feats = torch.randn(1, 32, 4, 6)
        mask = torch.zeros(1, 4, 6, dtype=torch.bool)
        model.backbone = _Fixed(feats, mask)  # replace the CNN (which leaks position through padding)
        with torch.no_grad():
            a = model(torch.zeros(1, 3, 64, 96))["pred_logits"]
            model.backbone = _Fixed(feats.flip(-1), mask)
            b = model(torch.zeros(1, 3, 64, 96))["pred_logits"]
        assert torch.allclose(a, b, atol=1e-5) == expect_invariant, pe


class _Fixed(torch.nn.Module):
    def __init__(self, feats, mask):
        super().__init__()
        self.feats, self.mask, self.num_channels, self.stride = feats, mask, feats.shape[1], 16

    def forward(self, images, mask):
        return self.feats, self.mask


@pytest.mark.parametrize("pe, pe_at, dec_pe, match", [
    ("rope_axial", "attn", None, "decoder's cross-attention .* needs an additive code"),
    ("relbias", "attn", None, "needs an additive code"),
    ("rope_axial", {"encoder": "input", "decoder": "none"}, None, "cannot be added at the encoder input"),
    ("peg", {"encoder": "attn", "decoder": "none"}, None, "goes at the encoder input"),
    ("sine", {"encoder": "attn", "decoder": "none"}, "sine", "the decoder takes no position"),
    ("sine", "everywhere", None, r"pe_at='everywhere': expected one of 'none', 'input', 'attn'"),
    ("sine", {"decoderr": "attn"}, None, r"pe_at has keys \['decoderr'\]"),
    ("sine", {"queries": "none"}, None, "object queries need their learned positions"),
])
def test_encodings_refused_where_their_family_cannot_act(pe, pe_at, dec_pe, match):
    kw = {"grid": (4, 6)} if pe == "relbias" else {}
    with pytest.raises(ValueError, match=match):
        create_detr(4, **{**SMALL, "pe": pe, "pe_at": pe_at, "dec_pe": dec_pe, **kw})


def test_rotary_bias_and_peg_in_the_encoder_with_an_additive_decoder():
    x = torch.randn(2, 3, 64, 96)
    for pe, kw in (("rope_axial", {}), ("rope_mixed", {}), ("relbias", {"grid": (4, 6)}),
                   ("peg", {"pe_at": {"encoder": "input", "decoder": "attn"}})):
        model = small(pe, dec_pe="sine", **kw)
        with torch.no_grad():
            out = model(x)
        assert torch.isfinite(out["pred_logits"]).all(), pe
        if pe in ("rope_axial", "rope_mixed", "relbias"):
            assert all(layer.self_attn.pe is not None for layer in model.transformer.encoder)
            assert all(layer.self_attn.pe is None and layer.cross_attn.pe is None for layer in model.transformer.decoder)


# --- padded-batch invariance -----------------------------------------------------------------------
@pytest.mark.parametrize("pe, kw", [("sine", {}), ("rope_axial", {"dec_pe": "sine"}), ("rope_mixed", {"dec_pe": "sine"}),
                                    ("learned_rowcol", {}), ("none", {})])
def test_image_alone_equals_image_padded_in_a_batch(pe, kw):
    """Mask-aware encodings (and learned row/col with bottom/right padding, and none) with the mask-aware backbone."""
    model = small(pe, **kw)
    torch.manual_seed(3)
    a = torch.randn(1, 3, 48, 64)  # multiples of the stride (16), as collate pads them
    big = torch.randn(1, 3, 80, 112)
    images = torch.zeros(2, 3, 80, 112)
    images[0, :, :48, :64], images[1] = a[0], big[0]
    mask = torch.ones(2, 80, 112, dtype=torch.bool)
    mask[0, :48, :64] = False
    mask[1] = False
    with torch.no_grad():
        alone = model(a)
        both = model(images, mask)
        images[0, :, 48:] = 7.0  # garbage in the padding changes nothing
        garbage = model(images, mask)
    for key in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(both[key][0], alone[key][0], rtol=0, atol=1e-4)
        torch.testing.assert_close(garbage[key][0], alone[key][0], rtol=0, atol=1e-4)


def test_small_cnn_features_are_batch_invariant_on_the_valid_area():
    cnn = SmallCNN((4, 8, 8, 8)).eval()
    a = torch.randn(1, 3, 37, 50)  # not a multiple of the stride: padded to 48 x 64 when alone
    alone_img = torch.zeros(1, 3, 48, 64)
    alone_img[..., :37, :50] = a
    alone_mask = torch.ones(1, 48, 64, dtype=torch.bool)
    alone_mask[:, :37, :50] = False
    batch_img = torch.zeros(1, 3, 96, 80)
    batch_img[..., :37, :50] = a
    batch_mask = torch.ones(1, 96, 80, dtype=torch.bool)
    batch_mask[:, :37, :50] = False
    fa, ma = cnn(alone_img, alone_mask)
    fb, mb = cnn(batch_img, batch_mask)
    assert ma.shape == (1, 3, 4) and (~ma).sum() == (~mb).sum() == 12  # ceil(37/16) x ceil(50/16) valid cells
    torch.testing.assert_close(fb[..., :3, :4], fa[..., :3, :4], rtol=0, atol=1e-5)


# --- criterion -----------------------------------------------------------------------------------
def test_perfect_predictions_have_zero_box_loss_and_low_class_loss():
    crit = SetCriterion(4)
    boxes = torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.1, 0.2]])
    logits = torch.full((1, 5, 5), -10.0)
    logits[0, :, 4] = 10.0  # every query says "no object"...
    logits[0, 1, 2], logits[0, 1, 4] = 10.0, -10.0  # ...except query 1 (class 2) and query 3 (class 0)
    logits[0, 3, 0], logits[0, 3, 4] = 10.0, -10.0
    pred = torch.rand(1, 5, 4) * 0.5 + 0.25
    pred[0, 1], pred[0, 3] = boxes[0], boxes[1]
    losses = crit({"pred_logits": logits, "pred_boxes": pred}, [{"boxes": boxes, "labels": torch.tensor([2, 0])}])
    assert losses["loss_bbox"].item() < 1e-6 and losses["loss_giou"].item() < 1e-5  # GIoU has an eps
    assert losses["loss_ce"].item() < 1e-6
    shifted = pred.clone()
    shifted[0, 1, 0] += 0.1
    worse = crit({"pred_logits": logits, "pred_boxes": shifted}, [{"boxes": boxes, "labels": torch.tensor([2, 0])}])
    assert abs(worse["loss_bbox"].item() - 0.1 / 2) < 1e-5  # L1 summed over boxes / number of boxes


def test_no_object_weight_and_aux_losses():
    crit = SetCriterion(4, eos_coef=0.1)
    logits = torch.randn(2, 5, 5)
    out = {"pred_logits": logits, "pred_boxes": torch.rand(2, 5, 4) * 0.4 + 0.3,
           "aux_outputs": [{"pred_logits": torch.randn(2, 5, 5), "pred_boxes": torch.rand(2, 5, 4) * 0.4 + 0.3}]}
    empty = [{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64)}] * 2
    losses = crit(out, empty)
    # no targets: every query is "no object" and the weighted mean is the plain mean of -log p(no object)
    expect = -logits.log_softmax(-1)[..., 4].mean()
    torch.testing.assert_close(losses["loss_ce"], expect)
    assert {"loss_ce_0", "loss_bbox_0", "loss_giou_0"} <= set(losses)
    total = sum(w * (losses[k] + losses[k + "_0"]) for k, w in (("loss_ce", 1), ("loss_bbox", 5), ("loss_giou", 2)))
    torch.testing.assert_close(losses["loss"], total)


@pytest.mark.parametrize("pe, kw", [("learned_rowcol", {}), ("rope_mixed", {"dec_pe": "learned_rowcol"}),
                                    ("relbias", {"grid": (4, 6), "dec_pe": "sine"}),
                                    ("peg", {"pe_at": {"encoder": "input", "decoder": "attn"}, "dec_pe": "learned_rowcol"})])
def test_gradients_reach_every_head_the_queries_and_every_learned_encoding(pe, kw):
    model = small(pe, **kw).train()
    out = model(torch.randn(2, 3, 64, 96))
    targets = [{"boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]]), "labels": torch.tensor([1])},
               {"boxes": torch.tensor([[0.3, 0.6, 0.1, 0.3], [0.7, 0.2, 0.2, 0.2]]), "labels": torch.tensor([0, 3])}]
    SetCriterion(4)(out, targets)["loss"].backward()
    no_grad = {n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)}
    # DETR at init: the first decoder self-attention sees zero queries and zero biases, so its output
    # is a constant and these weights get exactly zero gradient (as in DETR itself); nothing else may
    first_self_attn = {"transformer.decoder.0.self_attn.qkv.weight", "transformer.decoder.0.self_attn.proj.weight",
                       "transformer.decoder.0.norm1.weight"}
    assert no_grad <= first_self_attn, no_grad - first_self_attn
    for n, p in model.named_parameters():
        if n.startswith(("class_embed", "bbox_embed", "query_embed", "input_proj", "pe.", "dec_pe.")) or ".pe." in n:
            assert p.grad is not None and p.grad.abs().sum() > 0, n
    pe_params = [n for n, _ in model.named_parameters() if n.startswith(("pe.", "dec_pe.")) or ".self_attn.pe." in n]
    assert pe_params  # the encodings do have parameters, and all got gradients above


# --- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("boxes, labels, match", [
    ([[0.5, 0.5, 0.0, 0.2]], [1], r"targets\[0\]\['boxes'\]\[0\]=\[0.5, 0.5, 0.0, 0.2\]"),
    ([[0.9, 0.5, 0.4, 0.2]], [1], r"inside \[0, 1\]"),
    ([[0.5, 0.5, 0.2, -0.1]], [1], r"w > 0 and h > 0"),
    ([[0.5, 0.5, 0.2, 0.2]], [4], r"targets\[0\]\['labels'\]\[0\]=4: expected a class id in \[0, 4\)"),
    ([[0.5, 0.5, 0.2, 0.2]], [-1], r"labels'\]\[0\]=-1"),
])
def test_bad_targets_are_refused_by_name(boxes, labels, match):
    out = {"pred_logits": torch.randn(1, 5, 5), "pred_boxes": torch.rand(1, 5, 4)}
    with pytest.raises(ValueError, match=match):
        SetCriterion(4)(out, [{"boxes": torch.tensor(boxes), "labels": torch.tensor(labels)}])


def test_bad_images_and_masks_are_refused_by_name():
    model = small()
    x = torch.randn(2, 3, 64, 96)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 64, 95\): expected \(B, 64, 96\)"):
        model(x, torch.zeros(2, 64, 95, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask has dtype torch.int64: expected torch.bool"):
        model(x, torch.zeros(2, 64, 96, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"mask has shape \(3, 64, 96\): expected \(2, 64, 96\), one mask per image of images"):
        model(x, torch.zeros(3, 64, 96, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"images has shape \(3, 64, 96\)"):
        model(x[0])
    with pytest.raises(ValueError, match=r"images has shape \(0, 3, 64, 96\)"):
        model(x[:0])
    with pytest.raises(ValueError, match="unknown encoding 'sinee'"):
        create_detr(4, **{**SMALL, "pe": "sinee"})
    with pytest.raises(ValueError, match="backbone_weights='/nope.pth': not an option of backbone='small_cnn'"):
        create_detr(4, **{**SMALL, "backbone_weights": "/nope.pth"})


def test_every_registered_encoding_is_accepted_or_refused_with_a_reason():
    """No registered encoding crashes create_detr: it builds and runs, or raises a ValueError with a why."""
    built = []
    for name in vispe.available():
        kw = {"grid": (4, 6)}
        try:
            model = small(name, **kw)
        except ValueError as e:
            assert "needs an additive code" in str(e) or "goes at the encoder input" in str(e), (name, e)
            model = small(name, dec_pe="sine", pe_at={"encoder": "input" if "conditional" in str(e) or "goes at" in str(e)
                                                      else "attn", "decoder": "attn"}, **kw)
        with torch.no_grad():
            out = model(torch.randn(1, 3, 64, 96))
        assert torch.isfinite(out["pred_boxes"]).all(), name
        built.append(name)
    assert len(built) == len(vispe.available()) >= 15
