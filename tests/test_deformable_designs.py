"""The deformable operator under the query designs (create_detr(attention="deformable")): every
(attention, design, encoding) triple accepted or refused with its reason, every accepted one trains every
parameter (DDP needs a gradient for each), an image alone equals it padded in a batch, the papers'
initialisation, and the options the deformable detector adds."""
import pytest
import torch
from test_deformable_encoder import perturb

import vispe
from vispe.models.detr import create_detr
from vispe.models.detr.deformable_model import DeformableDETR

TINY = dict(backbone="small_cnn", backbone_widths=(4, 8, 8), d_model=32, nheads=2, enc_layers=1, dec_layers=2,
            dim_feedforward=32, num_queries=3, dropout=0.0, attention="deformable", num_feature_levels=2,
            backbone_levels=1, n_points=2)  # levels at strides 8 (the CNN's) and 16 (an extra convolution)
DESIGNS = {"deformable": dict(decoder="deformable"),
           "refine": dict(decoder="deformable", decoder_kwargs=dict(with_box_refine=True)),
           "two_stage": dict(decoder="deformable", decoder_kwargs=dict(with_box_refine=True, two_stage=True)),
           "dab": dict(decoder="dab"),
           "dino": dict(decoder="dino", decoder_kwargs=dict(dn_number=2))}
#: targets for the training forward (DINO's denoising groups are built from them; the other designs ignore them)
TARGETS = [{"boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.2, 0.2]]), "labels": torch.tensor([0, 2])},
           {"boxes": torch.tensor([[0.5, 0.5, 0.4, 0.3]]), "labels": torch.tensor([1])}]
#: the encodings an image alone and padded in a batch see alike on the deformable detector (explicit, so a
#: change of any encoding's mask handling shows here)
INVARIANT = ("sine", "fourier", "learned_rowcol", "sincos2d", "axis2d", "peg", "none")


def _pe_kwargs(name):
    kw = {"grid": (2, 3)} if name in ("learned_abs", "relbias", "relbias_axis", "irpe", "log_cpb") else {}
    if name == "fourier":
        kw["pe_kwargs"] = dict(mask_aware=True)
    return kw


def _place(name):
    return {"encoder": "input", "decoder": "attn"} if vispe.registry.get(name).family == "conditional" else "attn"


def configurations():
    """(label, kwargs, refusal pattern or None) for every design x every registered encoding on the deformable
    operator, plus every option that changes which modules exist or is refused there."""
    out = []
    for design in ("deformable", "dab", "dino", "detr", "conditional"):
        for name in vispe.available():
            family = vispe.registry.get(name).family
            refused = ("no reference point" if design == "detr" else "spatial query is concatenated"
                       if design == "conditional" else "no query-key dot product" if family in ("rotary", "bias")
                       else None)
            out.append((f"{design} pe={name}", dict(decoder=design, pe=name, pe_at=_place(name), **_pe_kwargs(name)),
                        refused))
            out.append((f"{design} pe={name} dec_pe=sine", dict(decoder=design, pe=name, pe_at=_place(name),
                                                               dec_pe="sine", **_pe_kwargs(name)),
                        refused or "keys are only sampled"))
    options = [
        ("refine", DESIGNS["refine"], None), ("two_stage", DESIGNS["two_stage"], None),
        ("two_stage without refinement", dict(decoder_kwargs=dict(two_stage=True)), None),
        ("two_stage all", dict(decoder_kwargs=dict(two_stage=True, two_stage_select="all")), None),
        ("two_stage relation", dict(DESIGNS["two_stage"], query_relation="relation"), None),
        ("relation on points", dict(query_relation="relation"), "needs anchor boxes"),
        ("dab relation", dict(decoder="dab", query_relation="relation"), None),
        ("dab points", dict(decoder="dab", decoder_kwargs=dict(query_dim=2)), None),
        ("dab no refinement", dict(decoder="dab", decoder_kwargs=dict(iter_refine=False)), None),
        ("dab random xy", dict(decoder="dab", decoder_kwargs=dict(random_refpoints_xy=True)), None),
        ("dab fourier anchors", dict(decoder="dab", decoder_kwargs=dict(anchor_pe="fourier", anchor_pe_kwargs=dict(
            mask_aware=True, learnable=True, mlp_dim=8))), None),
        ("dab keep_query_pos", dict(decoder="dab", decoder_kwargs=dict(keep_query_pos=True)), "every deformable"),
        ("dab enc_pos_scale", dict(decoder="dab", decoder_kwargs=dict(enc_pos_scale=True)), "no place in the"),
        ("dab modulate_hw", dict(decoder="dab", decoder_kwargs=dict(modulate_hw=True)), "only sampled"),
        ("boxrpb", dict(decoder="dab", box_bias="boxrpb"), "no such logits"),
        ("no level embedding", dict(level_pe="none"), None),
        ("pe at input", dict(pe_at={"encoder": "input", "decoder": "attn"}), None),
        ("pe nowhere", dict(pe_at={"encoder": "none", "decoder": "attn"}), "used nowhere else"),
        ("decoder keys at input", dict(pe_at={"encoder": "attn", "decoder": "input"}), "through where each query"),
        ("one level", dict(num_feature_levels=1), None), ("points pair", dict(n_points=(1, 3)), None),
        ("no encoder layers", dict(enc_layers=0), "enters only the encoder's layers"),
        ("no encoder layers, pe at input", dict(enc_layers=0, pe_at={"encoder": "input", "decoder": "attn"}), None),
        ("no encoder layers, no position", dict(enc_layers=0, pe="none", level_pe="none"), None), ("softmax", dict(class_head="softmax"), None),
        ("no aux", dict(aux_loss=False), None), ("gelu", dict(activation="gelu"), None),
        ("legacy init", dict(init="legacy"), "one initialisation"),
        ("detr design default", dict(decoder="detr"), "no reference point"),
        ("dino", DESIGNS["dino"], None),
        ("dino without denoising", dict(decoder="dino", decoder_kwargs=dict(dn_number=0)), None),
        ("dino look forward once", dict(decoder="dino", decoder_kwargs=dict(look_forward_twice=False)), None),
        ("dino select all", dict(decoder="dino", decoder_kwargs=dict(two_stage_select="all")), None),
        ("dino relation", dict(DESIGNS["dino"], query_relation="relation"), None),
        ("dino no aux", dict(DESIGNS["dino"], aux_loss=False), None),
        ("dino one level", dict(DESIGNS["dino"], num_feature_levels=1), None),
        ("dino fourier anchors", dict(decoder="dino", decoder_kwargs=dict(anchor_pe="fourier", anchor_pe_kwargs=dict(
            mask_aware=True, learnable=True, mlp_dim=8))), None),
        ("dino softmax", dict(DESIGNS["dino"], class_head="softmax"), "class_head='softmax'"),
        ("dino keep_query_pos", dict(decoder="dino", decoder_kwargs=dict(keep_query_pos=True)),
         "decoder_kwargs has \\['keep_query_pos'\\] for decoder='dino'"),
        ("dino box noise", dict(decoder="dino", decoder_kwargs=dict(dn_box_noise_scale=-1.0)), "dn_box_noise_scale"),
        ("dino dense", dict(decoder="dino", attention="dense", num_feature_levels=None, backbone_levels=None,
                            n_points=None), "decoder='dino' with attention='dense'"),
    ]
    out += [(f"option {label}", {"decoder": "deformable", **kw}, refused) for label, kw, refused in options]
    return out


CONFIGS = configurations()


def _loss(out):
    parts = [out, *out.get("aux_outputs", [])] + ([out["enc_outputs"]] if "enc_outputs" in out else [])
    if "dn_outputs" in out:  # DINO's denoising groups
        parts += [out["dn_outputs"], *out["dn_outputs"].get("aux_outputs", [])]
    return sum(o["pred_logits"].sum() + o["pred_boxes"].sum() for o in parts)


@pytest.mark.parametrize("chunk", range(2))
def test_every_triple_is_accepted_with_every_parameter_trained_or_refused_with_its_reason(chunk):
    """Each (deformable, design, encoding) configuration builds and gives every parameter a finite gradient
    in one backward (the two-stage proposals' heads through their loss, ``enc_outputs``), or is refused
    with the reason it lists; the refusals are exactly the expected ones."""
    images = torch.randn(2, 3, 32, 48)
    mask = torch.zeros(2, 32, 48, dtype=torch.bool)
    mask[1, :, 32:] = True
    for label, kw, refused in CONFIGS[chunk::2]:
        torch.manual_seed(0)
        if refused is not None:
            with pytest.raises(ValueError, match=refused):
                create_detr(3, **{**TINY, **kw})
            continue
        model = create_detr(3, **{**TINY, **kw}).train()
        assert isinstance(model, DeformableDETR), label
        out = model(images, mask, targets=TARGETS)
        assert ("dn_outputs" in out) == (kw.get("decoder") == "dino" and kw.get("decoder_kwargs", {}).get("dn_number", 100) > 0)
        _loss(out).backward()
        missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        assert not missing, (label, missing)
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert not bad, (label, bad)


def test_the_configurations_cover_every_encoding_and_design():
    from vispe.models.detr.design.designs import STRATEGIES

    labels = " ".join(label for label, _, _ in CONFIGS)
    assert all(f"{design} pe=" in labels for design in STRATEGIES)
    for name in vispe.available():
        for design in ("deformable", "dab"):
            assert f"{design} pe={name}" in labels
    accepted = {label.split(" pe=")[1] for label, kw, r in CONFIGS if r is None and " pe=" in label}
    families = {vispe.registry.get(n).family for n in accepted}
    assert families == {"additive", "conditional", "none"}


@pytest.mark.parametrize("kw, match", [
    (dict(decoder="deformable"), "decoder='deformable' with attention='dense'"),
    (dict(decoder="dab", num_feature_levels=4), "num_feature_levels=4 with attention='dense'"),
    (dict(decoder="dab", level_pe="none"), "level_pe='none' with attention='dense'"),
    (dict(decoder="dab", attention="sparse"), "attention='sparse': expected one of 'dense', 'deformable'"),
])
def test_the_dense_operator_refuses_the_deformable_options(kw, match):
    with pytest.raises(ValueError, match=match):
        create_detr(3, backbone="small_cnn", backbone_widths=(4, 8), d_model=16, nheads=2, **kw)


@pytest.mark.parametrize("design", ["deformable", "two_stage", "dab relation", "dino"])
def test_an_image_alone_equals_it_padded_in_a_batch(design):
    """Mask-aware small CNN and input projections, valid size a multiple of the coarsest stride (16): the
    image alone and padded into a larger batch (garbage in the padding) give the same outputs, for every
    encoding in INVARIANT (mask-aware, or cell indices from the top-left corner); the others (learned_abs
    resampled to the padded grid, normidx2d normalised by the padded size) are accepted but differ. Every weight is perturbed: at the papers' initialisation the sampling
    offsets and weights ignore the query, so position would have no effect to compare."""
    kw = dict(DESIGNS["dab"], query_relation="relation") if design == "dab relation" else DESIGNS[design]
    torch.manual_seed(3)
    a = torch.randn(1, 3, 32, 48)
    images = torch.full((2, 3, 64, 80), 7.0)
    images[0, :, :32, :48], images[1] = a[0], torch.randn(3, 64, 80)
    mask = torch.ones(2, 64, 80, dtype=torch.bool)
    mask[0, :32, :48], mask[1] = False, False
    for name in vispe.available():
        if vispe.registry.get(name).family in ("rotary", "bias"):
            continue
        torch.manual_seed(0)
        model = perturb(create_detr(3, **{**TINY, **kw, "pe": name, "pe_at": _place(name), **_pe_kwargs(name)}))
        with torch.no_grad():
            alone, both = model(a), model(images, mask)
        err = max((both[k][0] - alone[k][0]).abs().max().item() for k in ("pred_logits", "pred_boxes"))
        if name in INVARIANT:
            assert err < 1e-4, (design, name, err)
        else:
            assert err > 1e-4, (design, name, err)
