"""The detector's designs as issue 35 leaves them: every accepted configuration trains every parameter
(DDP needs a gradient for each), the papers' initialisation, one rotation kernel for queries and keys,
options checked at build, a typed design with the "first layer or keep_query_pos" rule in one place."""
import inspect
import math

import pytest
import torch

import vispe
from vispe.models.detr import create_detr
from vispe.models.detr.design.designs import STRATEGIES, CrossSpec, Design, LayerSpec, build_design
from vispe.models.detr.design.placement import Placement
from vispe.models.detr.design.rules import DESIGNS_ONLY
from vispe.models.detr.queries.positioned import DabQueries

TINY = dict(backbone="small_cnn", backbone_widths=(4, 8, 8, 16), d_model=16, nheads=2, enc_layers=1, dec_layers=2,
            dim_feedforward=16, num_queries=3, dropout=0.0)
SMALL = dict(backbone="small_cnn", backbone_widths=(8, 16, 16, 32), d_model=32, nheads=4, enc_layers=1,
             dec_layers=2, dim_feedforward=64, num_queries=6, dropout=0.0)


# --- no accepted configuration has a parameter without a gradient -----------------------------------------
def _needs_grid(name):
    """Encodings whose constructor requires ``grid`` (grid-sized tables), read from the registry."""
    p = inspect.signature(vispe.registry.get(name)).parameters.get("grid")
    return p is not None and p.default is inspect.Parameter.empty


def _pe_kwargs(name):
    return {"grid": (2, 3)} if _needs_grid(name) or name in ("relbias_axis", "irpe", "log_cpb") else {}


def configurations():
    """Every design x every registered encoding as the encoder's (pe) and the decoder keys' (dec_pe), plus
    every option of the designs and the model that changes which modules exist."""
    out = []
    for design in ("detr", "conditional", "dab"):
        for name in vispe.available():
            family = vispe.registry.get(name).family
            at = {"encoder": "input", "decoder": "attn"} if family == "conditional" else "attn"
            out.append((f"{design} pe={name}", dict(decoder=design, pe=name, pe_at=at, **_pe_kwargs(name))))
            out.append((f"{design} pe={name} dec_pe=sine", dict(decoder=design, pe=name, pe_at=at, dec_pe="sine",
                                                               **_pe_kwargs(name))))
            if family in ("additive", "rotary"):
                out.append((f"{design} dec_pe={name}", dict(decoder=design, dec_pe=name, **_pe_kwargs(name))))
    dab = dict(decoder="dab")
    options = {
        "keep_query_pos": dict(decoder_kwargs=dict(keep_query_pos=True)),
        "points": dict(decoder_kwargs=dict(query_dim=2)),
        "no modulation": dict(decoder_kwargs=dict(modulate_hw=False)),
        "no refinement": dict(decoder_kwargs=dict(iter_refine=False)),
        "random xy": dict(decoder_kwargs=dict(random_refpoints_xy=True)),
        "no encoder scale": dict(decoder_kwargs=dict(enc_pos_scale=False)),
        "boxrpb": dict(box_bias="boxrpb", box_bias_kwargs=dict(hidden=8)),
        "relation": dict(query_relation="relation"),
        "softmax": dict(class_head="softmax"),
        "legacy": dict(init="legacy"),
        "no aux": dict(aux_loss=False),
        "one layer": dict(dec_layers=1),
        "encoder none": dict(pe_at={"encoder": "none", "decoder": "attn"}, dec_pe=None),
        "encoder input": dict(pe_at={"encoder": "input", "decoder": "attn"}),
        "no encoder layers": dict(enc_layers=0),
        "prelu": dict(activation="prelu"),
        "learnable fourier anchors": dict(decoder_kwargs=dict(anchor_pe="fourier", anchor_pe_kwargs=dict(
            mask_aware=True, learnable=True, mlp_dim=8))),
    }
    for keys in ("sine", "rope_axial", "rope_mixed", "none"):
        base = dict(dab, dec_pe=keys) if keys != "none" else dict(dab, pe="none")
        for opt, kw in options.items():
            kw = {**kw, "pe": keys} if "dec_pe" in kw and keys != "none" else kw  # the keys' encoding as pe
            out.append((f"dab keys={keys} {opt}", {**base, **kw}))
        out.append((f"conditional keys={keys} keep", {**base, "decoder": "conditional",
                                                      "decoder_kwargs": dict(keep_query_pos=True)}))
        out.append((f"conditional keys={keys} one layer", {**base, "decoder": "conditional", "dec_layers": 1}))
    return out


CONFIGS = configurations()

_KEYS_NEED = "needs an additive code for its keys: the object queries have no 2D position"
_POSITIONED_NEED = ("needs the decoder's keys to carry an additive code (the papers' spatial part) or a rotary one "
                    "(rotated against the anchors)")


def expected_refusal(label: str) -> str | None:
    """The exact start of the message create_detr must refuse ``label`` with, or None where it must build. The
    rule, read off each encoding's family in the registry: DETR's object queries have no 2D position, so its
    decoder keys need an additive code (``rules.check_family``); the positioned designs take an additive or
    a rotary one, never a bias (it needs queries on the grid) nor a conditional one (a convolution of the
    features). Everything else in ``configurations()`` builds."""
    design, rest = label.split(" ", 1)
    if design not in ("detr", "conditional", "dab") or not rest.startswith(("pe=", "dec_pe=")):
        return None
    arg, name = rest.split(" ")[0].split("=")
    family = vispe.registry.get(name).family
    if " dec_pe=sine" in rest:  # the decoder's keys get the additive sine: every encoder encoding is fine there
        return None
    if design == "detr" and family in ("rotary", "bias", "conditional"):
        return f"{arg}={name!r} is a {family} encoding, but the decoder's cross-attention (pe_at decoder='attn') {_KEYS_NEED}"
    if design != "detr" and arg == "pe" and family in ("bias", "conditional"):
        return f"pe={name!r} is a {family} encoding: decoder={design!r} {_POSITIONED_NEED}"
    return None


#: how many configurations each rule refuses (a new encoding in the registry changes these on purpose)
REFUSED = sum(expected_refusal(label) is not None for label, _ in CONFIGS)


@pytest.mark.parametrize("chunk", range(4))
def test_every_accepted_configuration_gives_every_parameter_a_finite_gradient(chunk):
    """One backward of every configuration create_detr accepts: no parameter is left without a gradient
    (DistributedDataParallel without find_unused_parameters would stop), none is NaN. Issue 35's idle modules
    (query_scale / ref_anchor_head / k_pos with rotary keys, q_spatial / k_pos with pe='none', enc_pos_scale
    under a rotary encoder) fail this test before their fix. The refusals are exactly ``expected_refusal``'s,
    message included (issue 56: any message with "expected" in it used to pass, so a wrong refusal did too)."""
    images = torch.randn(2, 3, 32, 48)
    mask = torch.zeros(2, 32, 48, dtype=torch.bool)
    mask[1, :, 32:] = True  # a padded image: mask-aware paths run too
    for label, kw in CONFIGS[chunk::4]:
        torch.manual_seed(0)
        refusal = expected_refusal(label)
        if refusal is not None:
            with pytest.raises(ValueError) as e:
                create_detr(3, **{**TINY, **kw})
            assert str(e.value).startswith(refusal), (label, str(e.value))
            continue
        model = create_detr(3, **{**TINY, **kw}).train()
        out = model(images, mask)
        loss = sum(o["pred_logits"].sum() + o["pred_boxes"].sum() for o in [out, *out.get("aux_outputs", [])])
        loss.backward()
        missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        assert not missing, (label, missing)
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert not bad, (label, bad)


def test_the_refusals_are_the_ones_listed():
    """The rule above refuses 31 of the configurations today: 17 with DETR's queries (rotary, bias and
    conditional encodings as the keys' code), 7 per positioned design (bias and conditional ones)."""
    labels = [label for label, _ in CONFIGS if expected_refusal(label) is not None]
    assert REFUSED == len(labels) == 31
    assert sum(label.startswith("detr ") for label in labels) == 17


def test_the_registry_wide_configurations_cover_every_design_and_key_family():
    labels = " ".join(label for label, _ in CONFIGS)
    for name in vispe.available():
        assert f"pe={name}" in labels
    for design in STRATEGIES:  # the deformable operator's own designs: tests/test_deformable_designs.py
        assert f"{design} " in labels or design in DESIGNS_ONLY
    assert len(CONFIGS) > 150


# --- options checked at build, not at the first forward ----------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    (dict(decoder_kwargs=dict(anchor_pe_kwargs=dict(center=True))), "anchor_pe='sine' with anchor_pe_kwargs=.*center"),
    (dict(decoder_kwargs=dict(anchor_pe="fourier", anchor_pe_kwargs=dict(mask_aware=True, coords="index"))),
     "anchor_pe='fourier'.*needs one: extent=None with coords='index'"),
    (dict(decoder_kwargs=dict(anchor_pe="fourier")), "anchor_pe='fourier'.*mask_aware=False counts the grid"),
    (dict(decoder_kwargs=dict(anchor_pe_kwargs=dict(normalize=False))), "anchor_pe='sine'.*normalize=False"),
    (dict(dec_pe="rope_axial", dec_pe_kwargs=dict(coords="centered", normalize_coords="min")),
     "dec_pe='rope_axial' in the decoder's cross-attention.*normalize_coords='min'"),
    (dict(pe="rope_axial", pe_kwargs=dict(shift=0.5)), "pe='rope_axial' with shift=0.5 in the decoder's cross-attention"),
    (dict(dec_pe="rope_mixed", dec_pe_kwargs=dict(rescale=2.0, coords="centered")), "rescale=2 in the decoder"),
    (dict(dec_pe="rope_axial", dec_pe_kwargs=dict(jitter=0.1, stretch=1.5)), "jitter=0.1, stretch=1.5"),
    (dict(dec_pe="rope_axial", decoder_kwargs=dict(modulate_hw=True)), "modulate_hw=True with 'rotary' keys"),
    (dict(pe="none", decoder_kwargs=dict(modulate_hw=True)), "modulate_hw=True with 'none' keys"),
    (dict(pe="rope_axial", dec_pe="sine", decoder_kwargs=dict(enc_pos_scale=True)),
     r"enc_pos_scale'\]=True.*pe='rope_axial' is a rotary encoding"),
    (dict(enc_layers=0, decoder_kwargs=dict(enc_pos_scale=True)), "there are no encoder layers"),
    (dict(pe="learned_abs", grid=(2, 3), pe_at={"encoder": "none", "decoder": "attn"}, dec_pe="sine"),
     "pe='learned_abs' is used nowhere"),
    (dict(init="paper"), "init='paper': expected one of 'papers', 'legacy'"),
    (dict(box_bias="boxrpb", box_bias_kwargs=dict(hiden=8)), r"box_bias_kwargs has \['hiden'\]: expected some of hidden"),
])
def test_options_that_would_fail_later_are_refused_at_build(kw, match):
    with pytest.raises(ValueError, match=match):
        create_detr(3, **{**TINY, "decoder": "dab", **kw})


def test_encoder_augmentations_stay_allowed_with_a_decoder_encoding_of_its_own():
    model = create_detr(3, **{**TINY, "decoder": "dab", "pe": "rope_axial", "pe_kwargs": dict(shift=0.5),
                              "dec_pe": "rope_axial"})
    assert model.transformer.encoder[0].self_attn.pe.shift == 0.5
    assert model.transformer.decoder[0].cross_attn.pe.shift == 0.0


def test_a_rotary_encoder_encoding_follows_its_placement():
    """pe_at encoder='none' leaves the encoder's attention without the rotary encoding (it was attached
    to every encoder layer whatever the placement); the decoder keys still take it."""
    model = create_detr(3, **{**TINY, "decoder": "dab", "pe": "rope_axial", "pe_at": {"encoder": "none", "decoder": "attn"}})
    assert model.transformer.encoder[0].self_attn.pe is None
    assert model.transformer.decoder[0].cross_attn.pe is not None


def test_fourier_grid_and_at_agree_on_a_padded_batch_or_at_refuses():
    """mask_aware=False measures its grid over the padded canvas: at() (unit coordinates of the valid area)
    cannot agree there, so it refuses; mask-aware, cell centres give the grid's code on the padded image."""
    ctx = dict(dim=16, num_prefix_tokens=0)
    mask = torch.zeros(2, 3, 5, dtype=torch.bool)
    mask[1, :, 3:] = True  # image 1: 3 x 3 valid
    ys, xs = torch.meshgrid(torch.arange(3.0), torch.arange(3.0), indexing="ij")
    coords = ((torch.stack([ys, xs], -1).reshape(1, 9, 2) + 0.5) / torch.tensor([3.0, 3.0]))
    extent = torch.tensor([[3.0, 3.0]])
    for coord_mode in ("centered", "normalized", "index"):
        aware = vispe.registry.build_in("fourier", ctx, coords=coord_mode, mask_aware=True)
        grid = aware((3, 5), mask)[1].reshape(3, 5, 16)[:, :3].reshape(9, 16)
        torch.testing.assert_close(aware.at(coords, extent)[0], grid, rtol=0, atol=1e-5)
        plain = vispe.registry.build_in("fourier", ctx, coords=coord_mode)
        assert not plain.supports_coords
        with pytest.raises(ValueError, match="mask_aware=False counts the grid over the padded canvas"):
            plain.at(coords, extent)


# --- the papers' initialisation ---------------------------------------------------------------------------
def _xavier_bound(w):
    return math.sqrt(6 / (w.shape[0] + w.shape[1]))


def test_papers_init_is_the_conditional_and_dab_detr_code():
    torch.manual_seed(0)
    model = create_detr(4, **SMALL, decoder="dab", box_bias="boxrpb", box_bias_kwargs=dict(hidden=16))
    torch.testing.assert_close(model.class_embed.bias, torch.full((4,), -math.log(99)))  # focal prior 0.01
    last = model.bbox_embed.layers[-1]
    assert last.weight.abs().max() == 0 and last.bias.abs().max() == 0
    for name, p in model.queries.named_parameters():  # Xavier, as inside the papers' transformer
        if p.dim() == 2:
            b = _xavier_bound(p)
            assert p.abs().max() <= b and p.abs().max() > 0.8 * b > 1.3 / math.sqrt(p.shape[1]), name  # not PyTorch's
    d = model.transformer.d_model
    for layer in model.transformer.decoder:
        for attn in (layer.self_attn, layer.cross_attn):  # content projections: nn.Linear's default bias
            assert 0 < attn.qkv.bias.abs().max() <= 1 / math.sqrt(d) and attn.proj.bias.abs().max() == 0
    for layer in model.transformer.encoder:  # the encoder is DETR's nn.MultiheadAttention: zero biases
        assert layer.self_attn.qkv.bias.abs().max() == 0
    with torch.no_grad():  # the zero box layer: every query's first box is its anchor
        out = model.eval()(torch.randn(1, 3, 48, 64))
    torch.testing.assert_close(out["aux_outputs"][0]["pred_boxes"][0], model.query_embed.weight.sigmoid())


def test_legacy_init_keeps_vispes_previous_initialisation():
    torch.manual_seed(0)
    model = create_detr(4, **SMALL, decoder="dab", init="legacy")
    assert (model.class_embed.bias + math.log(99)).abs().min() > 1 and model.bbox_embed.layers[-1].weight.abs().max() > 0
    for layer in model.transformer.decoder:
        assert layer.self_attn.qkv.bias.abs().max() == 0 and layer.cross_attn.qkv.bias.abs().max() == 0
    w = model.queries.ref_point_head.layers[0].weight  # PyTorch's default: bound 1 / sqrt(fan_in)
    assert w.abs().max() <= 1 / math.sqrt(w.shape[1])


def test_papers_init_leaves_the_encodings_own_initialisation():
    """RoPE-Mixed's frequencies keep rope-vit's magnitudes theta^(-4j/head_dim) per pair, and a learnable
    anchor code keeps its Gaussian frequencies: neither is overwritten by Xavier."""
    from vispe.image.fourier import gaussian_frequencies

    torch.manual_seed(0)
    model = create_detr(4, **SMALL, decoder="dab", dec_pe="rope_mixed", decoder_kwargs=dict(
        anchor_pe="fourier", anchor_pe_kwargs=dict(mask_aware=True, learnable=True)))
    freqs = model.transformer.decoder[0].cross_attn.pe.freqs  # (heads, hd/2, 2)
    hd = SMALL["d_model"] // SMALL["nheads"]
    mags = 10.0 ** (-4 * torch.arange(hd // 4).float() / hd)
    torch.testing.assert_close(freqs.norm(dim=-1), torch.cat([mags, mags])[None].expand_as(freqs[..., 0]),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.queries.anchor_pe.freqs, gaussian_frequencies(SMALL["d_model"] // 2, 1.0, 0))


def test_detr_has_one_initialisation_under_both_names():
    sds = []
    for init in ("papers", "legacy"):
        torch.manual_seed(0)
        sds.append(create_detr(4, **SMALL, init=init).state_dict())
    assert all(torch.equal(sds[0][k], sds[1][k]) for k in sds[0])


# --- one rotation path --------------------------------------------------------------------------------------
def test_queries_and_keys_of_rotary_cross_attention_go_through_the_same_kernel(monkeypatch):
    """Both sides are rotated by vispe.kernels.rope with the layer's rope_impl: two kernel calls per
    cross-attention, and the fused path equals the reference one, gradients included."""
    from vispe.kernels import rope

    torch.manual_seed(0)
    model = create_detr(4, **SMALL, decoder="conditional", dec_pe="rope_mixed").train()
    images = torch.randn(2, 3, 48, 64)
    calls = []
    real = rope._Rotate.apply
    monkeypatch.setattr(rope._Rotate, "apply", lambda *a: calls.append(a[0].shape) or real(*a))
    out = model(images)
    assert len(calls) == 2 * SMALL["dec_layers"]  # keys and queries of each cross-attention
    monkeypatch.undo()
    grads = []
    for impl in ("fused", "reference"):
        vispe.kernels.set_impl(model, rope=impl)
        model.zero_grad()
        out = model(images)
        (out["pred_logits"].sum() + out["pred_boxes"].sum()).backward()
        grads.append((out["pred_boxes"].detach(), model.transformer.decoder[1].cross_attn.pe.freqs.grad.clone(),
                      model.queries.ref_point_head.layers[0].weight.grad.clone()))
    for a, b in zip(*grads):  # the anchors' gradient reaches ref_point_head through the query rotation
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert grads[0][2].abs().sum() > 0


# --- a typed design, one rule, no dead names ----------------------------------------------------------------
def test_build_design_returns_a_typed_design_whose_layers_follow_the_strategys_rule():
    design = build_design("dab", dict(keep_query_pos=False), box_bias="boxrpb", d_model=32, num_layers=3,
                          placement=Placement(), pe="sine")
    assert isinstance(design, Design) and isinstance(design.queries, DabQueries)
    assert design.cross == CrossSpec("dense", "concat", {"stride": 16.0})
    assert [s.query_pos for s in design.layers()] == [True, False, False]
    assert all(isinstance(s, LayerSpec) and s.decoupled for s in design.layers())
    keep = build_design("dab", dict(keep_query_pos=True), d_model=32, num_layers=3, placement=Placement(), pe="sine")
    assert [s.query_pos for s in keep.layers()] == [True, True, True]


def test_the_layers_and_the_contexts_read_one_rule(monkeypatch):
    """A strategy with another rule (p_q in the last layer only) builds its layers and contexts from it:
    the q_pos projection exists exactly where the contexts put p_q, and the model runs."""
    monkeypatch.setattr(DabQueries, "query_pos_in_cross", lambda self, i: i == 1)
    torch.manual_seed(0)
    model = create_detr(4, **SMALL, decoder="dab")
    assert [layer.cross_attn.q_pos is not None for layer in model.transformer.decoder] == [False, True]
    with torch.no_grad():
        out = model(torch.randn(1, 3, 48, 64))
    assert torch.isfinite(out["pred_boxes"]).all()


def test_anchors_are_refined_between_layers_only(monkeypatch):
    calls = []
    real = DabQueries.refine
    monkeypatch.setattr(DabQueries, "refine", lambda self, i, *a: calls.append(i) or real(self, i, *a))
    model = create_detr(4, **{**SMALL, "dec_layers": 3}, decoder="dab")
    with torch.no_grad():
        model(torch.randn(1, 3, 48, 64))
    assert calls == [0, 1]


def test_the_transformer_reset_leaves_an_attached_encoding_alone():
    """Xavier on every matrix of the transformer skips encodings inside it (RoPE-Mixed's frequencies)."""
    from vispe.models.detr.transformer.dense import Transformer

    t = Transformer(32, 4, 1, 2, 64)
    pe = vispe.registry.build_in("rope_mixed", dict(dim=32, num_heads=4, head_dim=8, num_prefix_tokens=0))
    t.decoder[0].cross_attn.set_pe(pe)
    before = pe.freqs.detach().clone()
    t._reset_parameters()
    torch.testing.assert_close(pe.freqs.detach(), before, rtol=0, atol=0)


def test_dead_names_are_gone():
    from vispe.image._rotary import RotaryBase
    from vispe.models.detr.queries import positioned as queries
    from vispe.models.detr.transformer import dense as transformer

    assert not hasattr(RotaryBase, "_extent")  # one valid-extent function: vispe.coords.valid_extent
    assert not hasattr(queries, "CROSS")
    assert "cross_pe" not in transformer.DecoderLayer.__init__.__code__.co_varnames
    for cls in STRATEGIES.values():
        assert "num_layers" not in cls.__init__.__code__.co_varnames
