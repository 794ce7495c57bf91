"""The one key-renaming engine (``vispe.models.detr.load.keys.rename_keys``): the rules, the q / k / v
fusion, a zero bias for a projection without one (LW-DETR's k), unknown keys refused by name, and ``layer_rules``:
the original layers' table, on torch's own ``nn.TransformerDecoderLayer`` names."""
import re

import pytest
import torch
from torch import nn

from vispe.models.detr.load.keys import layer_rules, rename_keys

FUSE = re.compile(r"^(.*\.attn)\.(q|k|v)_proj\.(weight|bias)$")
RULES = [(r"^enc\.(\d+)\.(q|k|v)\.(\w+)$", r"blocks.\1.attn.\2_proj.\3"), (r"^head\.(\w+)$", r"head.\1")]


def _state(k_bias: bool = True) -> dict:
    g = torch.Generator().manual_seed(0)
    s = {f"enc.0.{c}.weight": torch.randn(4, 4, generator=g) for c in "qkv"}
    s |= {f"enc.0.{c}.bias": torch.randn(4, generator=g) for c in ("qkv" if k_bias else "qv")}
    return s | {"head.weight": torch.randn(2, 4, generator=g)}


def test_fused_rows_are_q_k_v():
    s = _state()
    out, rest = rename_keys(s, RULES, fuse=FUSE)
    assert rest == {} and set(out) == {"blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "head.weight"}
    assert torch.equal(out["blocks.0.attn.qkv.weight"], torch.cat([s[f"enc.0.{c}.weight"] for c in "qkv"]))
    assert torch.equal(out["blocks.0.attn.qkv.bias"], torch.cat([s[f"enc.0.{c}.bias"] for c in "qkv"]))


def test_zero_bias_fills_the_missing_rows_only():
    s = _state(k_bias=False)
    with pytest.raises(ValueError, match=r"\['q', 'v'\] projections for blocks\.0\.attn\.bias"):
        rename_keys(s, RULES, fuse=FUSE)
    out, _ = rename_keys(s, RULES, fuse=FUSE, zero_bias="k")
    bias = out["blocks.0.attn.qkv.bias"]  # (12,) rows q, k, v
    assert torch.equal(bias[:4], s["enc.0.q.bias"]) and torch.equal(bias[8:], s["enc.0.v.bias"])
    assert torch.equal(bias[4:8], torch.zeros(4))
    with pytest.raises(ValueError, match=r"zero_bias='x'"):
        rename_keys(s, RULES, fuse=FUSE, zero_bias="x")


def test_unknown_keys_refused_by_name():
    s = _state() | {"enc.0.extra": torch.zeros(1)}
    out, _ = rename_keys(s, RULES, fuse=FUSE)  # without unknown=True: kept as it is
    assert "enc.0.extra" in out
    with pytest.raises(ValueError, match=r"weights has 1 tensors no rule knows: \['enc\.0\.extra'\]"):
        rename_keys(s, RULES, fuse=FUSE, unknown=True, name="weights")
    out, _ = rename_keys(_state(), RULES, fuse=FUSE, unknown=True)  # an identity rule counts as known
    assert "head.weight" in out


def test_layer_rules_rename_torch_decoder_layer_names_keeping_the_prefix_groups():
    layer = nn.TransformerDecoderLayer(8, 2, 16)
    # the originals call the cross-attention (deformable there) cross_attn, torch multihead_attn
    state = {f"decoder.decoder.layers.3.{k.replace('multihead_attn', 'cross_attn')}": v
             for k, v in layer.state_dict().items()}
    state["decoder.decoder.layers.3.gateway.gate.weight"] = torch.zeros(1)
    out, _ = rename_keys(state, layer_rules(r"^decoder\.decoder\.layers\.(\d+)\.", r"decoder.layers.\1.",
                                            mlp=("mlp.layers.0", "mlp.layers.1"), cross="encoder_attn",
                                            norms=("n1", "n2", "n3")), fuse=None)
    want = {"self_attn.qkv.weight", "self_attn.qkv.bias", "self_attn.proj.weight", "self_attn.proj.bias",
            "encoder_attn.in_proj_weight", "encoder_attn.in_proj_bias", "encoder_attn.out_proj.weight",
            "encoder_attn.out_proj.bias", "mlp.layers.0.weight", "mlp.layers.0.bias", "mlp.layers.1.weight",
            "mlp.layers.1.bias", "n1.weight", "n1.bias", "n2.weight", "n2.bias", "n3.weight", "n3.bias",
            "gateway.gate.weight"}
    assert set(out) == {f"decoder.layers.3.{k}" for k in want}
    assert out["decoder.layers.3.self_attn.qkv.bias"] is state["decoder.decoder.layers.3.self_attn.in_proj_bias"]
    kept, _ = rename_keys({"decoder.decoder.layers.3.gateway.gate.weight": torch.zeros(1)},
                          layer_rules(r"^decoder\.decoder\.layers\.(\d+)\.", r"decoder.layers.\1.", rest=False),
                          fuse=None)
    assert set(kept) == {"decoder.decoder.layers.3.gateway.gate.weight"}  # rest=False: only the table's names
