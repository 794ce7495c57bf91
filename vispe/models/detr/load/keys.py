"""The one key-renaming engine of every detector loader (``load``, ``load_deformable``,
``load_deformable_detr``): a loader is a list of ``(pattern, replacement)`` rules on this engine.

``rename_keys(state, rules, fuse=..., keep=...)`` applies the rules in order to every key (``re.sub``;
``num_batches_tracked`` entries are dropped: frozen batch norm has none), fuses separate q, k, v
projections (keys matching ``fuse``: groups (prefix, "q" | "k" | "v", "weight" | "bias")) into one
``{prefix}.qkv.{kind}`` with rows q, k, v (``nn.MultiheadAttention``'s ``in_proj`` layout, vispe's
``Attention.qkv``), and returns the entries ``keep(old, new)`` refuses untouched beside them, for the
loader's next rules. ``zero_bias`` names the projections whose bias a source may lack (LW-DETR's k
projection has none): their rows of the fused bias are zeros, which changes no attention weight.
``unknown=True`` refuses, by name, every key that no rule matches (a loader whose rules cover its whole
layout, an identity rule for a name that stays). ``resnet_of(state)`` reads a torchvision ResNet's depth
off its weights.

``layer_rules(src, dst, ...)``: the one table of the original repositories' transformer layers (torch's
``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` names, which lyuwenyu/RT-DETR, D-FINE, DEIMv2,
LW-DETR and RF-DETR keep) as vispe's names, for the layers whose keys start with ``src``.
"""
from __future__ import annotations

import re
from collections.abc import Callable

import torch

#: transformers' separate projections of any attention: ``...self_attn.q_proj.weight``
QKV = re.compile(r"^(.*\.(?:self_attn|cross_attn))\.(q|k|v)_proj\.(weight|bias)$")
#: (blocks in layer3, bottleneck blocks) -> torchvision ResNet
RESNETS_BY_SHAPE = {(2, False): "resnet18", (6, False): "resnet34", (6, True): "resnet50", (23, True): "resnet101"}


def rename_keys(state: dict, rules, *, fuse: re.Pattern | None = QKV, keep: Callable[[str, str], bool] | None = None,
                name: str = "source", zero_bias: str = "", unknown: bool = False) -> tuple[dict, dict]:
    """``(renamed, rest)`` of ``state`` (module docstring); ``name`` is what the errors call ``state``."""
    if set(zero_bias) - set("qkv"):
        raise ValueError(f"zero_bias={zero_bias!r}: expected letters of 'qkv' (the projections that may lack a bias)")
    compiled = [(re.compile(p) if isinstance(p, str) else p, r) for p, r in rules]
    renamed, rest, pieces, unmatched = {}, {}, {}, []
    for key, value in state.items():
        if key.endswith("num_batches_tracked"):
            continue
        new, hits = key, 0
        for pattern, repl in compiled:
            new, n = pattern.subn(repl, new)
            hits += n
        if unknown and not hits:
            unmatched.append(key)
            continue
        if keep is not None and not keep(key, new):
            rest[key] = value
            continue
        m = fuse.match(new) if fuse is not None else None
        if m:  # separate q, k, v -> one qkv, rows q, k, v
            pieces.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = value
            continue
        renamed[new] = value
    if unmatched:
        raise ValueError(f"{name} has {len(unmatched)} tensors no rule knows: {unmatched[:8]}")
    for (prefix, kind), parts in pieces.items():
        if kind == "bias" and parts and set("qkv") - set(parts) <= set(zero_bias):
            first = next(iter(parts.values()))
            parts = {c: parts.get(c, torch.zeros_like(first)) for c in "qkv"}
        if set(parts) != {"q", "k", "v"}:
            raise ValueError(f"{name} has {sorted(parts)} projections for {prefix}.{kind}: expected q, k and v")
        renamed[f"{prefix}.qkv.{kind}"] = torch.cat([parts[c] for c in "qkv"], 0)
    return renamed, rest


def layer_rules(src: str, dst: str, *, mlp: tuple[str, str] = ("mlp.fc1", "mlp.fc2"),
                norms: tuple[str, str, str] = ("norm1", "norm2", "norm3"), cross: str = "cross_attn",
                rest: bool = True) -> list[tuple[str, str]]:
    r"""Rules renaming the original layers under the pattern ``src`` (its groups, e.g. the layer index, kept:
    ``r"^decoder\.decoder\.layers\.(\d+)\."``) to vispe's under ``dst`` (``r"decoder.layers.\1."``):
    ``self_attn.in_proj_{weight,bias}`` -> ``self_attn.qkv`` (the same rows q, k, v), ``self_attn.out_proj`` ->
    ``self_attn.proj``, ``linear1`` / ``linear2`` -> ``mlp``, ``norm1..3`` -> ``norms``, ``cross_attn`` -> ``cross``;
    with ``rest`` the layers' other keys move to ``dst`` under their own names (last rule).  # [(pattern, repl)]"""
    kind = rf"\g<{re.compile(src).groups + 1}>"  # the group after src's own
    rules = [(src + r"self_attn\.in_proj_(weight|bias)$", dst + "self_attn.qkv." + kind),
             (src + r"self_attn\.out_proj\.", dst + "self_attn.proj."),
             (src + r"linear1\.", dst + mlp[0] + "."), (src + r"linear2\.", dst + mlp[1] + "."),
             *((src + rf"norm{i}\.", dst + name + ".") for i, name in enumerate(norms, 1)),
             (src + r"cross_attn\.", dst + cross + ".")]
    return rules + [(src, dst)] if rest else rules


def resnet_of(state: dict, prefix: str = "backbone.body.") -> str | None:
    """The torchvision ResNet whose weights ``state`` holds under ``prefix``, or None."""
    blocks = len({k[len(prefix) + 7:].split(".")[0] for k in state if k.startswith(prefix + "layer3.")})
    return RESNETS_BY_SHAPE.get((blocks, f"{prefix}layer1.0.conv3.weight" in state))
