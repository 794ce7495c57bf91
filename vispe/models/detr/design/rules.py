"""Every compatibility rule of the detector, each refusal with its reason: which encoding goes where
(``check_family``, ``check_used``), what the deformable operator accepts (``check``,
``check_deformable_pe``, ``check_level_pe``, ``check_heads``). The builders (``designs.build_design``,
``model.create_detr``, ``deformable_build``) call them; a new design's rules go here.

What the deformable operator accepts (``create_detr(attention="deformable")``), and why the rest is refused.

Multi-scale deformable attention (Zhu et al., ICLR 2021) has no query-key dot product: a query predicts
sampling offsets and weights from its content plus its position ``p_q``, and reads the memory
bilinearly around its reference point. What that means for each option:

| option | on the deformable operator |
|---|---|
| ``decoder`` | "dino" (DINO: DAB's anchors from mixed query selection, contrastive denoising groups in training, look-forward-twice: ``vispe.models.detr.queries.dino``), "deformable" (Deformable DETR's queries: ``query_embed`` split into ``p_q`` and the content, reference points ``sigmoid(Linear(p_q))``; ``with_box_refine``, ``two_stage``) or "dab" (DAB's anchors are the reference points, ``p_q = MLP(A(anchor))`` at every layer: DINO's query formulation: learned content ``tgt_embed``, heads shared by the layers, the decoder norm on every layer's output, ``look_forward_twice`` as an option; without its denoising and mixed query selection (``formulation="legacy"``: vispe's before issue 46, zero content, per-layer heads, no norm); the anchors are coded in units of each image's valid area, batch-invariant, where DINO's code takes them scaled by level 0's valid ratio, i.e. in units of the padded canvas). "detr" is refused (its learned query positions give no reference point: that is "deformable"), "conditional" too (its spatial query is concatenated to q for a dot product with the keys' code; with reference points from ``p_q`` it is "deformable"). |
| ``pe`` (encoder tokens) | additive (per level, mask-aware where the encoding is, plus the level embedding ``level_pe``), at ``pe_at`` encoder "attn" (added to the query of every encoder layer, the paper's) or "input" (added once to the tokens); conditional (PEG) at "input": applied to every level's map before flattening; "none": the level embedding alone. Rotary and bias encodings are refused: there is no q.k to rotate or bias. |
| ``dec_pe`` | refused: the decoder's keys are only sampled, they carry no code; the queries' position is the anchors' (``decoder_kwargs`` ``anchor_pe`` for "dab"). |
| ``pe_at`` decoder | "attn" only (position enters through where each query samples). |
| ``box_bias`` (BoxRPB) | refused: it biases attention logits of a query against every cell; sampling attention has no such logits (its weights come from the query alone). |
| ``query_relation`` | accepted where anchors are boxes before the first layer ("dab" with ``query_dim=4``, "deformable" with ``two_stage=True``): it biases the decoder's self-attention, which is dense (Relation-DETR is a deformable detector). |
| ``keep_query_pos`` | refused ("dab"): every deformable layer takes ``p_q``. |
| ``enc_pos_scale`` | refused ("dab"): DAB's encoder scaling has no place in the deformable encoder. |
| ``enc_layers=0`` | with a code at the encoder's attention ("attn"): refused (the code would be used nowhere). |
| ``init`` | "papers" (Deformable DETR's code; see ``deformable_build``); "legacy" refused (there is no earlier vispe initialisation of this detector). |
"""
from __future__ import annotations

from vispe.encoding import PositionEncoding
from vispe.models.detr.design.placement import Placement
from vispe.registry import get

#: the cross-attention operators each query design takes; a new design's entry is added by
#: ``designs.register_strategy`` (its strategy file and that call are all a new design touches)
DESIGN_OPERATORS: dict[str, tuple[str, ...]] = {
    "detr": ("dense",), "conditional": ("dense",), "dab": ("dense", "deformable"),
    "deformable": ("deformable",), "dino": ("deformable",)}
DESIGNS = tuple(d for d, ops in DESIGN_OPERATORS.items() if "deformable" in ops)  # the built-in designs the deformable operator takes
DESIGNS_ONLY = tuple(d for d, ops in DESIGN_OPERATORS.items() if ops == ("deformable",))  # built-in designs that need it


def check_operator(decoder: str, attention: str) -> None:
    """Refuse a design on an operator it does not take, with the reason (the built-in designs') or the
    operators its registration names (a new design's)."""
    ops = DESIGN_OPERATORS.get(decoder, ())
    if attention in ops:
        return
    if attention == "deformable":
        takes = tuple(d for d, o in DESIGN_OPERATORS.items() if "deformable" in o)
        why = ("its learned query positions give no reference point to sample around; decoder='deformable' is "
               "DETR's learned queries with reference points from them (Deformable DETR)" if decoder == "detr" else
               "its spatial query is concatenated to q for a dot product with the keys' code, and deformable "
               "attention has no such product; with reference points from p_q it is decoder='deformable'"
               if decoder == "conditional" else f"it is registered for the operators {ops}")
        raise ValueError(f"decoder={decoder!r} with attention='deformable': {why}; expected one of "
                         f"{', '.join(map(repr, takes))}")
    what = ("Deformable DETR's queries sample" if decoder == "deformable" else
            "DINO's (mixed query selection from the multi-scale encoder's proposals) queries sample" if decoder == "dino"
            else f"it is registered for the operators {ops}: its queries sample")
    raise ValueError(f"decoder={decoder!r} with attention={attention!r}: {what} the memory at their reference points; "
                     f"expected attention='deformable' (or a dense design: "
                     f"{', '.join(repr(d) for d, o in DESIGN_OPERATORS.items() if attention in o)})")


def check(decoder: str, decoder_kwargs: dict, *, placement: Placement, pe: str, dec_pe: str | None,
          box_bias: str | None, init: str) -> None:
    """Refuse, with the reason, what the deformable operator cannot take (module docstring)."""
    check_operator(decoder, "deformable")
    family = get(pe).family
    if family in ("rotary", "bias"):
        raise ValueError(f"pe={pe!r} is a {family} encoding with attention='deformable': deformable attention has no "
                         "query-key dot product to rotate or bias (queries predict sampling offsets and weights, keys "
                         "are only sampled); expected an additive encoding (e.g. 'sine'), a conditional one or 'none'")
    if dec_pe is not None:
        raise ValueError(f"dec_pe={dec_pe!r} with attention='deformable': the decoder's keys are only sampled at the "
                         "queries' reference points and carry no code; expected dec_pe=None (the queries' position "
                         "is their anchors': decoder_kwargs anchor_pe for decoder='dab')")
    if placement.decoder != "attn":
        raise ValueError(f"pe_at decoder={placement.decoder!r} with attention='deformable': position enters the "
                         "deformable cross-attention through where each query samples, not through a code on the "
                         "keys; expected 'attn'")
    if family != "none":
        allowed = ("input",) if family == "conditional" else ("attn", "input")
        if placement.encoder not in allowed:
            raise ValueError(f"pe={pe!r} ({family}) with pe_at encoder={placement.encoder!r} and attention="
                             f"'deformable': expected {' or '.join(map(repr, allowed))} (a code used nowhere else: "
                             "the deformable decoder's keys take none); pe='none' keeps the level embedding alone")
    if box_bias is not None:
        raise ValueError(f"box_bias={box_bias!r} with attention='deformable': BoxRPB biases the attention logits of a "
                         "query against every memory cell, and sampling attention has no such logits (its weights "
                         "come from the query alone); expected box_bias=None")
    for name in ("keep_query_pos", "enc_pos_scale"):
        if name in decoder_kwargs:
            why = ("every deformable decoder layer adds p_q to its query (the sampling offsets and weights are "
                   "predicted from it)" if name == "keep_query_pos" else
                   "DAB's encoder scaling of the additive code has no place in the deformable encoder")
            raise ValueError(f"decoder_kwargs[{name!r}]={decoder_kwargs[name]!r} with attention='deformable': {why}; "
                             "expected it unset")
    if init != "papers":
        raise ValueError(f"init={init!r} with attention='deformable': the deformable detector has one initialisation, "
                         "Deformable DETR's code ('papers'); expected init='papers'")


def check_family(pe: str, family: str, placement: Placement, dec_pe: str | None, dec_family: str | None, *,
                 design: str = "detr", positioned: bool | None = None) -> None:
    """Refuse an encoding at a place its family cannot act on, saying why and what to do.

    With positioned queries (``design`` "conditional" or "dab") the decoder's keys may also take a
    rotary encoding (queries rotated at their anchors); they need some key position ("attn")."""
    if family == "none":
        return
    enc = placement.encoder
    if family in ("rotary", "bias") and enc == "input":
        raise ValueError(f"pe={pe!r} is a {family} encoding: it acts inside attention (on q and k, or on the "
                         "logits), so it cannot be added at the encoder input; use pe_at encoder='attn'")
    if family == "conditional" and enc == "attn":
        raise ValueError(f"pe={pe!r} is conditional (a convolution of the features): it goes at the encoder "
                         "input; use pe_at encoder='input'")
    if placement.decoder == "none":
        if dec_pe is not None:
            raise ValueError(f"dec_pe={dec_pe!r} with pe_at decoder='none': the decoder takes no position")
        return
    fam = dec_family if dec_pe is not None else family
    name = dec_pe if dec_pe is not None else pe
    if design != "detr" if positioned is None else positioned:
        arg = "dec_pe" if dec_pe is not None else "pe"
        if placement.decoder != "attn":
            raise ValueError(f"pe_at decoder={placement.decoder!r} with decoder={design!r}: positioned queries meet "
                             "the keys' positions in every cross-attention; expected pe_at decoder='attn'")
        if fam not in ("additive", "rotary"):
            raise ValueError(f"{arg}={name!r} is a {fam} encoding: decoder={design!r} needs the decoder's keys to "
                             "carry an additive code (the papers' spatial part) or a rotary one (rotated against "
                             "the anchors); a relative bias needs queries on the grid (for boxes see "
                             "box_bias='boxrpb'). Pass dec_pe='sine' or dec_pe='rope_axial'")
        return
    if fam not in ("additive", "none"):
        raise ValueError(f"{'dec_pe' if dec_pe is not None else 'pe'}={name!r} is a {fam} encoding, but the "
                         f"decoder's cross-attention (pe_at decoder={placement.decoder!r}) needs an additive code "
                         "for its keys: the object queries have no 2D position to rotate with or to take a "
                         "relative bias from. Pass an additive dec_pe (e.g. 'sine') or pe_at decoder='none'")


def check_used(pe: str, family: str, placement, dec_pe: str | None, keys: str) -> None:
    """Refuse an encoding no layer would use: its settings (and any parameter) would be ignored."""
    if family == "none" or placement.encoder != "none":
        return
    if placement.decoder != "none" and dec_pe is None:
        return
    where = ("the decoder takes no position" if placement.decoder == "none" else
             f"the decoder's keys take dec_pe={dec_pe!r}")
    raise ValueError(f"pe={pe!r} is used nowhere: pe_at encoder='none' and {where}; expected pe='none' or a place "
                     "that uses it")


def check_deformable_pe(pe: PositionEncoding | None, name: str = "pe") -> None:
    """Refuse an encoding that cannot enter deformable attention, with the reason."""
    if pe is None or pe.family in ("additive", "none"):
        return
    if pe.family in ("rotary", "bias"):
        raise ValueError(f"{name} is a {pe.family} encoding ({type(pe).__name__}): deformable attention has no "
                         "query-key dot product to rotate or bias (queries predict sampling offsets and weights, "
                         "keys are only sampled); use an additive encoding per level (e.g. 'sine')")
    raise ValueError(f"{name} is a {pe.family} encoding ({type(pe).__name__}): expected an additive encoding "
                     "(a conditional one acts on the feature maps, before the levels are flattened)")


def check_level_pe(level_pe: str | None, placement: Placement) -> str:
    """The level embedding's setting: "none" by default where nothing enters the encoder (``pe_at`` encoder
    "none"), "learned" elsewhere; "learned" there is refused (it would be used nowhere)."""
    if placement.encoder == "none" and level_pe == "learned":
        raise ValueError("level_pe='learned' with pe_at encoder='none': the level embedding enters the encoder's "
                         "tokens only, so it would be used nowhere (and get no gradient); expected level_pe='none' "
                         "(the default there) or pe_at encoder='attn' / 'input'")
    return ("none" if placement.encoder == "none" else "learned") if level_pe is None else level_pe


def check_heads(queries, aux_loss: bool) -> None:
    """Per-layer heads under refinement train only through the auxiliary losses: the refined anchors are
    detached, so without them the heads of layers 0 .. L-2 get no gradient (and DDP stops)."""
    if not aux_loss and queries.refines and not queries.shared_heads:
        option = "with_box_refine" if queries.design == "deformable" else "iter_refine"
        raise ValueError(f"aux_loss=False with decoder_kwargs[{option!r}]=True: the heads are one per layer and the "
                         "refined anchors are detached, so without the auxiliary losses the heads of every layer but "
                         "the last get no gradient (and DistributedDataParallel stops); expected aux_loss=True")
