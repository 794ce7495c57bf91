"""The detector's query designs as named choices: ``create_detr(decoder=..., decoder_kwargs=..., box_bias=...)``.

| ``decoder`` | ``decoder_kwargs`` (each paper's ablations; anything else is refused) |
|---|---|
| ``"detr"`` | none (the object queries' placement is ``query_pos_at`` / ``pe_at["queries"]``) |
| ``"conditional"`` | ``anchor_pe`` ("sine"), ``anchor_pe_kwargs``, ``keep_query_pos`` (False) |
| ``"dab"`` | ``anchor_pe``, ``anchor_pe_kwargs``, ``query_dim`` (4 boxes or 2 points), ``modulate_hw`` (default: query_dim == 4), ``iter_refine`` (True), ``random_refpoints_xy`` (False: the anchors' (cx, cy) drawn uniformly and kept fixed), ``keep_query_pos`` (False), ``enc_pos_scale`` (True: DAB's encoder scales its code by an MLP of the tokens) |

How anchors meet the keys follows from the decoder's key encoding (``dec_pe``, else ``pe``): an
additive one gives the papers' concatenated spatial part; a rotary one (``rope_axial``,
``rope_mixed``) rotates queries at their anchor centres and keys at their cells. ``box_bias="boxrpb"``
(``box_bias_kwargs``: ``hidden`` 512, ``transform`` "linear" | "abs_log8", ``stride`` = the
backbone's) adds Plain-DETR's box bias to every cross-attention; it needs box anchors (``"dab"``,
``query_dim=4``). ``class_head``: "softmax" (DETR's K + 1 logits) or "sigmoid" (K logits and the focal
loss, the default of the positioned designs, as their papers).
"""
from __future__ import annotations

from vispe.models.detr.box_bias import BoxRPB
from vispe.models.detr.queries import DESIGNS, ConditionalQueries, DabQueries, QueryPositions
from vispe.registry import build_in, get

CLASS_HEADS = ("softmax", "sigmoid")
BOX_BIASES = ("boxrpb",)
_KWARGS = {
    "detr": set(),
    "conditional": {"anchor_pe", "anchor_pe_kwargs", "keep_query_pos"},
    "dab": {"anchor_pe", "anchor_pe_kwargs", "query_dim", "modulate_hw", "iter_refine", "random_refpoints_xy",
            "keep_query_pos", "enc_pos_scale"},
}


def _bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"decoder_kwargs[{name!r}]={value!r}: expected True or False")
    return value


def build_design(decoder: str, decoder_kwargs: dict, *, box_bias: str | None, box_bias_kwargs: dict,
                 d_model: int, nheads: int, queries_at: str, key_family: str | None, stride: float,
                 dec_layers: int = 2) -> dict:
    """The pieces of a design: ``queries`` (strategy), ``layer_kwargs`` (per decoder layer),
    ``enc_pos_scale``, ``query_dim``, ``random_refpoints_xy``, ``default_class_head``."""
    if decoder not in DESIGNS:
        raise ValueError(f"decoder={decoder!r}: expected one of {', '.join(map(repr, DESIGNS))}")
    kw = dict(decoder_kwargs)
    unknown = sorted(set(kw) - _KWARGS[decoder])
    if unknown:
        allowed = ", ".join(sorted(_KWARGS[decoder])) or "none"
        raise ValueError(f"decoder_kwargs has {unknown} for decoder={decoder!r}: expected some of {allowed}")
    if box_bias is not None and box_bias not in BOX_BIASES:
        raise ValueError(f"box_bias={box_bias!r}: expected None or one of {', '.join(map(repr, BOX_BIASES))}")
    if box_bias is None and box_bias_kwargs:
        raise ValueError(f"box_bias_kwargs={box_bias_kwargs!r} with box_bias=None: there is no box bias to take them")
    if decoder == "detr":
        if box_bias is not None:
            raise ValueError(f"box_bias={box_bias!r} with decoder='detr': DETR's queries have no anchor boxes; "
                             "use decoder='dab'")
        return dict(queries=QueryPositions(d_model, queries_at=queries_at), layer_kwargs=None, enc_pos_scale=False,
                    query_dim=None, random_refpoints_xy=False, default_class_head="softmax")
    if queries_at != "attn":
        raise ValueError(f"pe_at['queries']={queries_at!r} with decoder={decoder!r}: positioned queries take their "
                         "positions at every attention layer; expected 'attn'")
    cross = "rotary" if key_family == "rotary" else "concat"
    anchor = kw.pop("anchor_pe", "sine")
    anchor_pe = build_in(anchor, dict(dim=d_model, num_prefix_tokens=0), **kw.pop("anchor_pe_kwargs", {}))
    if not anchor_pe.supports_coords or anchor_pe.family != "additive":
        raise ValueError(f"anchor_pe={anchor!r}: expected an additive encoding that can be evaluated at "
                         f"continuous coordinates (e.g. 'sine'); {anchor!r} cannot: {anchor_pe.coords_refusal()}")
    keep = _bool("keep_query_pos", kw.pop("keep_query_pos", False))
    enc_scale = _bool("enc_pos_scale", kw.pop("enc_pos_scale", decoder == "dab"))
    random_xy = _bool("random_refpoints_xy", kw.pop("random_refpoints_xy", False))
    if decoder == "conditional":
        queries, query_dim = ConditionalQueries(d_model, anchor_pe, cross=cross, keep_query_pos=keep,
                                                num_layers=dec_layers), None
    else:
        query_dim = kw.pop("query_dim", 4)
        queries = DabQueries(d_model, anchor_pe, query_dim=query_dim, modulate_hw=kw.pop("modulate_hw", None),
                             iter_refine=_bool("iter_refine", kw.pop("iter_refine", True)), cross=cross,
                             keep_query_pos=keep, num_layers=dec_layers)
    if box_bias is not None and query_dim != 4:
        raise ValueError(f"box_bias={box_bias!r} with decoder={decoder!r}"
                         f"{', query_dim=2' if decoder == 'dab' else ''}: the box bias needs anchor boxes "
                         "(decoder='dab', query_dim=4)")
    bias_kw = {"stride": float(stride), **box_bias_kwargs}

    def layer_kwargs(i: int) -> dict:
        return dict(decoupled=True, cross_query_pos=i == 0 or keep,
                    spatial=cross == "concat",
                    box_bias=BoxRPB(nheads, **bias_kw) if box_bias is not None else None)

    return dict(queries=queries, layer_kwargs=layer_kwargs, enc_pos_scale=enc_scale, query_dim=query_dim,
                random_refpoints_xy=random_xy, default_class_head="sigmoid")


def key_family(pe: str, dec_pe: str | None) -> str | None:
    """Family of the encoding the decoder's keys get: ``dec_pe``'s, else ``pe``'s."""
    return get(dec_pe if dec_pe is not None else pe).family


def fix_refpoints_xy(weight, generator=None) -> None:
    """DAB-DETR's ``random_refpoints_xy``: anchor centres drawn uniformly in (0, 1) and kept fixed.

    DAB-DETR's code sets ``requires_grad = False`` on a slice of the weight, which PyTorch ignores
    (the centres then train); here their gradient is zeroed by a hook, so they stay where drawn
    (weight decay, if the optimiser applies it to ``query_embed``, still shrinks them slightly).
    """
    import torch

    from vispe.models.detr.mlp import inverse_sigmoid

    with torch.no_grad():
        weight[:, :2] = inverse_sigmoid(torch.rand(weight.shape[0], 2, generator=generator))

    def zero_xy(grad):
        grad = grad.clone()
        grad[:, :2] = 0
        return grad

    weight.register_hook(zero_xy)
