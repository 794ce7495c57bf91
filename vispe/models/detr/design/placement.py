"""Where position enters a DETR-style detector: the named choices of DETR's Table 3.

Three places, each ``"none"``, ``"input"`` or ``"attn"``:

| place | ``"input"`` | ``"attn"`` (DETR's default) |
|---|---|---|
| ``encoder`` | the 2D code is added once to the encoder's input tokens (a conditional encoding, PEG, is applied there too) | added to q and k of every encoder self-attention (rotary: q and k rotated; bias: added to the logits) |
| ``decoder`` | the 2D code is added once to the memory (keys and values of every cross-attention) | added to the keys of every decoder cross-attention |
| ``queries`` | the learned query positions are the decoder's input (instead of zeros) | added to q and k of every decoder self-attention and to q of every cross-attention |

What each family can do (anything else is refused with the reason):

* additive: encoder and decoder, at the input or at every attention layer;
* rotary, bias: encoder ``"attn"`` only: they act on q/k (or logits) of one grid, while DETR's
  object queries have no 2D position; give the decoder an additive ``dec_pe`` (e.g. ``"sine"``)
  or ``decoder="none"``; positioned queries (``create_detr(decoder="conditional" | "dab")``) take
  a rotary encoding in the decoder too, rotated at their anchors;
* block rotations (``liere``, ``comrope``, ``string``: rotary encodings with ``block_size > 2``) go
  where rotary ones go, by the same rules: encoder self-attention, and with positioned queries the
  decoder's cross-attention, each query rotated at its anchor (``at``, block form through
  ``vispe.kernels.rope_blocks``). Accepted for all three because each is defined at any point;
  only ComRoPE and STRING (and LieRE with 2 x 2 blocks) keep a query-key logit a function of the
  anchor-to-cell offset alone: LieRE's larger blocks do not commute, so its logits also depend on
  where the anchor is. ``lookhere`` is a bias: encoder ``"attn"`` only, as every bias;
* conditional (PEG): encoder ``"input"`` only (on the projected feature map, CPVT's placement);
* none: no position anywhere, whatever the places say.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vispe import _checks

PLACES = ("none", "input", "attn")
KEYS = ("encoder", "decoder", "queries")


@dataclass(frozen=True)
class Placement:
    encoder: str = "attn"
    decoder: str = "attn"
    queries: str = "attn"


def parse_placement(pe_at, query_pos_at: str = "attn") -> Placement:
    """``pe_at`` a place for encoder and decoder, or a mapping with keys of ``KEYS``."""
    if isinstance(pe_at, str):
        _checks.choice("pe_at", pe_at, PLACES)
        places = {"encoder": pe_at, "decoder": pe_at}
    elif isinstance(pe_at, Mapping):
        unknown = sorted(set(pe_at) - set(KEYS))
        if unknown:
            raise ValueError(f"pe_at has keys {unknown}: expected some of {', '.join(map(repr, KEYS))}")
        places = {k: _checks.choice(f"pe_at[{k!r}]", v, PLACES) for k, v in pe_at.items()}
    else:
        raise ValueError(f"pe_at={pe_at!r}: expected one of {', '.join(map(repr, PLACES))} or a mapping "
                         f"with keys {', '.join(map(repr, KEYS))}")
    if "queries" in places and query_pos_at != "attn":
        raise ValueError(f"query_pos_at={query_pos_at!r} and pe_at['queries']={places['queries']!r}: set it once")
    places.setdefault("queries", _checks.choice("query_pos_at", query_pos_at, ("input", "attn")))
    if places["queries"] == "none":
        raise ValueError("pe_at['queries']='none': DETR's object queries need their learned positions "
                         "(they are what tells the queries apart); expected 'input' or 'attn'")
    return Placement(**places)
