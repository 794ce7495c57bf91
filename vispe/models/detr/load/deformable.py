"""Load Deformable DETR's weights into ``create_detr(attention="deformable", decoder="deformable")``
(``load_detr``'s path for them; the key maps of the shared pieces: ``vispe.models.detr.load.deformable_keys``).

Sources: transformers' ``DeformableDetrForObjectDetection`` (its ``config`` gives the architecture), its
``state_dict()`` with ``config=`` that config (or with the arguments the weights cannot give), the same
for ``DeformableDetrModel``'s keys, and fundamentalvision/Deformable-DETR's ``checkpoint.pth``
(``{"model": state_dict, "args": Namespace}``, or the state_dict alone), for the single-stage,
``with_box_refine`` and ``two_stage`` variants. The timm / torchvision ResNet backbone, sine position
(Deformable DETR's: ``level_pos.DEFORMABLE_SINE``), sigmoid class heads. Two-stage queries select
proposals as the references do (``two_stage_select="all"``: every token competes).

The rest of the keys: ``query_position_embeddings`` / ``query_embed`` -> ``query_embed``;
``reference_points``, ``enc_output``, ``enc_output_norm``, ``pos_trans``, ``pos_trans_norm`` ->
``queries.*``; ``class_embed.{i}``, ``bbox_embed.{i}`` as they are; the decoder's own copies of the heads
(``model.decoder.bbox_embed`` / ``transformer.decoder.bbox_embed``, ``...class_embed``: the same modules
in the references) must hold the same tensors as the heads and are dropped. What the weights cannot
say (heads, dropout; the number of two-stage proposals) comes from the config or ``args``; a bare
state_dict needs ``nheads=`` (and ``num_queries=`` for two-stage), as DETR's.
"""
from __future__ import annotations

import re

import torch

from vispe.models.detr.load.deformable_keys import deformable_format, deformable_keys
from vispe.models.detr.load.keys import rename_keys, resnet_of
from vispe.models.detr.load.positioned import args_dict, check_timm_backbone, load_fitting_state
from vispe.models.detr.model import create_detr
from vispe.models.detr.neck.level_pos import DEFORMABLE_SINE

_REST = {"transformers": [(r"^model\.query_position_embeddings\.", "query_embed."),
                          (r"^model\.(reference_points|enc_output|enc_output_norm|pos_trans|pos_trans_norm)\.",
                           r"queries.\1."),
                          (r"^model\.decoder\.(bbox_embed|class_embed)\.", r"@tied.\1.")],
         "official": [(r"^transformer\.(reference_points|enc_output|enc_output_norm|pos_trans|pos_trans_norm)\.",
                       r"queries.\1."),
                      (r"^transformer\.decoder\.(bbox_embed|class_embed)\.", r"@tied.\1.")]}


def is_deformable(source) -> bool:
    """Whether ``source`` (a module or a state_dict / checkpoint dict) is a Deformable DETR."""
    if isinstance(source, torch.nn.Module):
        return getattr(getattr(source, "config", None), "model_type", None) == "deformable_detr"
    if isinstance(source, dict) and isinstance(source.get("model"), dict):
        source = source["model"]
    return isinstance(source, dict) and deformable_format(source) is not None


def rename(state: dict) -> tuple[dict, bool]:
    """(every key of a Deformable DETR state_dict under vispe's names, whether it refines boxes: the decoder
    holds the box heads); the decoder's head copies checked against the heads and dropped."""
    fmt = deformable_format(state)
    renamed, rest = deformable_keys(state, fmt)
    rules = _REST["official" if fmt == "official" else "transformers"]
    if fmt == "transformers_model":
        rest = {"model." + k: v for k, v in rest.items()}
    more, _ = rename_keys(rest, rules, fuse=None)
    tied = {k[len("@tied."):]: v for k, v in more.items() if k.startswith("@tied.")}  # the decoder's head copies
    renamed.update({k: v for k, v in more.items() if not k.startswith("@tied.")})
    for key, value in tied.items():
        if key not in renamed or not torch.equal(renamed[key], value):
            raise ValueError(f"source's decoder copy of {key!r} differs from the detector's head (or the head is "
                             "missing): in Deformable DETR they are one module; expected equal tensors")
    return renamed, any(k.startswith("bbox_embed.") for k in tied)


def hints_from_config(c) -> dict:
    """create_detr arguments from a transformers ``DeformableDetrConfig``."""
    name = check_timm_backbone(c)
    if c.encoder_attention_heads != c.decoder_attention_heads or c.encoder_ffn_dim != c.decoder_ffn_dim:
        raise ValueError("source has different encoder and decoder heads or FFN sizes: vispe's deformable detector "
                         "uses one of each")
    if getattr(c, "activation_function", "relu") != "relu":
        raise ValueError(f"source has activation_function={c.activation_function!r}: expected 'relu' (the paper's)")
    if c.position_embedding_type != "sine":
        raise ValueError(f"source has position_embedding_type={c.position_embedding_type!r}: expected 'sine' (its "
                         "'learned' table is looked up by index per level, which no vispe encoding does)")
    points = (c.encoder_n_points, c.decoder_n_points)
    return dict(backbone=name, dilation=bool(getattr(c, "dilation", False)), nheads=c.encoder_attention_heads,
                dropout=c.dropout, attn_dropout=c.attention_dropout, aux_loss=bool(c.auxiliary_loss),
                num_queries=c.two_stage_num_proposals if c.two_stage else c.num_queries,
                n_points=points[0] if points[0] == points[1] else points)


def hints_from_args(args) -> dict:
    """create_detr arguments from fundamentalvision's ``args`` (its main.py's Namespace)."""
    a = args_dict(args)
    if a.get("position_embedding", "sine") != "sine":
        raise ValueError(f"source was trained with --position_embedding {a['position_embedding']}: expected sine")
    hints = {k2: a[k1] for k1, k2 in (("backbone", "backbone"), ("dilation", "dilation"), ("nheads", "nheads"),
                                       ("dropout", "dropout"), ("num_queries", "num_queries")) if k1 in a}
    if "aux_loss" in a:
        hints["aux_loss"] = bool(a["aux_loss"])
    if "enc_n_points" in a:
        p = (a["enc_n_points"], a.get("dec_n_points", a["enc_n_points"]))
        hints["n_points"] = p[0] if p[0] == p[1] else p
    return hints


def architecture(state: dict, hints: dict) -> dict:
    """create_detr arguments read off the renamed weights (and ``hints`` for what they cannot say)."""
    def count(prefix):
        return len({k[len(prefix):].split(".")[0] for k in state if k.startswith(prefix)})

    for need in ("level_pos.level_embed", "class_embed.0.weight", "encoder.layers.0.mlp.fc1.weight"):
        if need not in state:
            raise ValueError(f"source has no weights for {need!r} (after renaming): not a Deformable DETR checkpoint")
    L, d = state["level_pos.level_embed"].shape
    two_stage = "queries.enc_output.weight" in state
    dec_layers = count("decoder.layers.")
    refine = hints.pop("with_box_refine")
    if not refine:  # one shared head per kind: its copies must agree
        for key in [k for k in state if re.match(r"^(class|bbox)_embed\.[1-9]\d*\.", k)]:
            first = re.sub(r"^(class|bbox)_embed\.\d+\.", r"\1_embed.0.", key)
            if not torch.equal(state[key], state[first]):
                raise ValueError(f"source's {key!r} differs from {first!r}: without box refinement (no decoder box "
                                 "heads) Deformable DETR shares one head across layers; expected equal tensors")
    arch = dict(num_classes=state["class_embed.0.weight"].shape[0], d_model=d, num_feature_levels=L,
                enc_layers=count("encoder.layers."), dec_layers=dec_layers,
                dim_feedforward=state["encoder.layers.0.mlp.fc1.weight"].shape[0],
                backbone=hints.get("backbone") or resnet_of(state), attention="deformable",
                decoder="deformable", pe="sine", pe_kwargs=dict(DEFORMABLE_SINE), class_head="sigmoid",
                decoder_kwargs=dict(with_box_refine=refine, two_stage=two_stage,
                                    **({"two_stage_select": "all"} if two_stage else {})))
    if not two_stage:
        arch["num_queries"] = state["query_embed.weight"].shape[0]
    arch.update({k: hints[k] for k in ("dilation", "nheads", "dropout", "attn_dropout", "aux_loss", "n_points",
                                       "num_queries") if k in hints})
    if refine:  # the source's auxiliary_loss=False only drops the auxiliary outputs (the final ones are the same);
        arch["aux_loss"] = True  # vispe's per-layer heads need them to train, and refuse aux_loss=False
    if "nheads" in arch and "n_points" not in arch:  # sampling_offsets: heads * levels * points * 2 rows
        arch["n_points"] = state["encoder.layers.0.self_attn.sampling_offsets.weight"].shape[0] // (arch["nheads"] * L * 2) \
            if arch["enc_layers"] else 4
    return arch


def load_deformable_detr(source, config=None, **overrides):
    """The vispe detector for a Deformable DETR ``source`` (module docstring)."""
    hints = {}
    if isinstance(source, torch.nn.Module):
        config, source = source.config, source.state_dict()
    if isinstance(source.get("model"), dict):
        hints = hints_from_args(source.get("args"))
        source = source["model"]
    if config is not None:
        hints = hints_from_config(config)
    state, refine = rename(source)
    hints["with_box_refine"] = refine
    if "nheads" not in hints and "nheads" not in overrides:
        raise ValueError("source is a Deformable DETR state_dict without its configuration: the number of attention "
                         "heads cannot be read from the weights; pass config=... (transformers) or nheads=... (and "
                         "num_queries=... for two-stage)")
    kwargs = {**architecture(state, hints), **overrides}
    if "num_queries" not in kwargs:
        raise ValueError("source is a two-stage Deformable DETR without its configuration: the number of proposals "
                         "(two_stage_num_proposals) cannot be read from the weights; pass num_queries=...")
    model = create_detr(**kwargs)
    return load_fitting_state(model, state, "source does not fit vispe's deformable detector", kwargs)
