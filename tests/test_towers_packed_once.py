"""The packed path runs the blocks once over the packed sequence (1, T, C), as the originals do, and only
attention is split per size group (``PosContext.segments``). Checked against the path it replaced (each
size group through the blocks on its own, ``run_groups`` as of da08e0e, copied below as the reference):
equal in float64, values and gradients, for every tower with a packed path and every encoding family;
each block called once per forward; ``Attention`` over segments equal to attention per group."""
from __future__ import annotations

import pytest
import torch

from tests.test_towers_packed import QWEN_THW, _idefics3, _inputs, _siglip2, pt
from vispe.attention import Attention, PosContext, Segment
from vispe.kernels.grouped import TokenGroups, windows
from vispe.models.towers import idefics3, pixtral, qwen_vl, siglip2
from vispe.models.vit import convert_vit
from vispe.registry import build_in

MODULES = {"qwen2_vl": qwen_vl, "qwen2_5_vl": qwen_vl, "qwen3_vl": qwen_vl, "pixtral": pixtral,
           "siglip2": siglip2, "idefics3": idefics3}


def run_groups(tower, virtual, groups, *, prep=None, window=None, keep_states=False):
    """The per-group packed path as of da08e0e (vispe/models/towers/_packed.py, verbatim but for this
    docstring): every size group runs the tower's blocks on its own."""
    outs: list[torch.Tensor] = []
    states: list[list[torch.Tensor]] = []
    row = 0
    for (h, w), frames in groups:
        n = frames * h * w
        x = virtual[row:row + n].reshape(frames, h * w, -1)  # (S_g, h*w, C)
        row += n
        x, pos = tower.input_code(x, (h, w), None)
        if prep is not None:
            x = prep(x)
        seen: list[torch.Tensor] = []
        x = tower.run_blocks(x, PosContext((h, w), 0, None, pos), window((h, w)) if window else None,
                             (lambda s: seen.append(s.reshape(n, -1))) if keep_states else None)
        outs.append(x.reshape(n, -1))
        states.append(seen)
    out = torch.cat(outs)  # (T, C)
    if not keep_states:
        return out, None
    return out, [torch.cat([s[k] for s in states]) for k in range(len(states[0]))]


@pytest.fixture(scope="module")
def originals():
    return {name: pt.TOWERS[name].build("tiny") for name in (*QWEN_THW, "pixtral")}


def _tower(name, pe, pe_kwargs, originals):
    """(tower in float64 on the packed path, its call's args) for a mixed-size batch."""
    if name == "siglip2":
        _, t, args = _siglip2(pe)
    elif name == "idefics3":
        _, t, x, pm = _idefics3(pe)
        args = (x, pm)
    else:
        m = originals[name]
        t = convert_vit(m, pe, **pe_kwargs)
        args, _ = _inputs(name, m, torch.Generator().manual_seed(11))
    t = t.double().train()
    t.path = "packed"
    return t, args


def _values_and_grads(t, args):
    t.zero_grad()
    x = args[0].double().requires_grad_(True)
    out = t(x, *args[1:], output_hidden_states=True)
    assert t.last_path == "packed"
    last = out.last_hidden_state
    loss = (last * torch.linspace(-1, 1, last.numel(), dtype=last.dtype).view_as(last)).sum()
    extra = [out.pooler_output] if getattr(out, "pooler_output", None) is not None else []
    extra += list(getattr(out, "deepstack_features", None) or [])
    for e in extra:
        loss = loss + e.square().mean()
    loss.backward()
    return [last.detach(), *(s.detach() for s in out.hidden_states), *(e.detach() for e in extra), x.grad] + \
        [p.grad for p in t.parameters() if p.grad is not None]


CASES = [(name, None, {}) for name in MODULES] + [
    ("qwen2_5_vl", "rope_mixed", {}),
    ("qwen2_5_vl", "log_cpb", {}),  # a bias: windows as a boolean mask per segment
    ("qwen2_vl", "relbias", {"pe_kwargs": {"grid": (12, 12)}}),  # a bias table (RelativeBias)
    ("pixtral", "peg", {"peg_blocks": (0, 1)}),  # conditional, between blocks, per group
    ("qwen2_vl", "sincos2d", {"pe_at": "every_block"}),  # additive on q and k in every block: ctx.pos (1, T, C)
    ("siglip2", "rope_axial", {}),
    ("idefics3", "rope_mixed", {}),
]


@pytest.mark.parametrize("name,pe,pe_kwargs", CASES, ids=[f"{n}-{p}" for n, p, _ in CASES])
def test_blocks_once_equal_the_per_group_path_in_float64(name, pe, pe_kwargs, originals, monkeypatch):
    t, args = _tower(name, pe, pe_kwargs, originals)
    new = _values_and_grads(t, args)
    monkeypatch.setattr(MODULES[name], "run_packed", run_groups)
    old = _values_and_grads(t, args)
    assert len(new) == len(old) > 8
    assert old[0].abs().max() > 0.5
    for a, b in zip(new, old, strict=True):
        assert a.shape == b.shape
        assert (a - b).abs().max() <= 1e-11 * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("name", list(MODULES))
def test_each_block_runs_once_per_forward_on_the_packed_path(name, originals, monkeypatch):
    t, args = _tower(name, None, {}, originals)
    calls = [0] * len(t.blocks)
    for i, blk in enumerate(t.blocks):
        blk.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    with torch.no_grad():
        t(*args)
    assert t.last_path == "packed"
    assert calls == [1] * len(t.blocks)
    monkeypatch.setattr(MODULES[name], "run_packed", run_groups)  # the path it replaced: once per size group
    calls[:] = [0] * len(t.blocks)
    with torch.no_grad():
        t(*args)
    assert min(calls) >= 3


@pytest.mark.parametrize("pe", ["rope_axial", "relbias", None])
def test_attention_over_segments_equals_attention_per_group(pe):
    """One call over (1, T, C) with segments == each group's frames on their own grid (and its windows)."""
    torch.manual_seed(0)
    attn = Attention(32, 4, qkv_bias=True).double()
    if pe:
        attn.set_pe(build_in(pe, dict(dim=32, num_heads=4, head_dim=8, grid=(6, 6), num_prefix_tokens=0)).double())
    groups = [((3, 5), 2), ((1, 6), 1), ((6, 1), 3)]  # ((h, w), frames)
    xs = [torch.randn(f, h * w, 32, dtype=torch.float64) for (h, w), f in groups]
    masks = [None, None, TokenGroups(windows((6, 1), 4), 6) if pe != "relbias" else None]
    segs, row = [], 0
    for (shape, f), x in zip(groups, xs):
        segs.append(Segment(row, f, PosContext(shape)))
        row += x.numel() // 32
    packed = torch.cat([x.reshape(-1, 32) for x in xs])[None].requires_grad_(True)  # (1, T, C)
    got = attn(packed, attn_mask=tuple(masks), ctx=PosContext(segments=tuple(segs)))  # (1, T, C)
    want = torch.cat([attn(x, attn_mask=m, ctx=PosContext(shape)).reshape(-1, 32)
                      for ((shape, _), x, m) in zip(groups, xs, masks)])
    torch.testing.assert_close(got[0], want, rtol=0, atol=1e-12)
    got.sum().backward()
    assert packed.grad is not None and packed.grad.abs().max() > 0


def test_bad_segments_are_refused():
    attn = Attention(16, 2)
    seg = (Segment(0, 2, PosContext((2, 3))), Segment(12, 1, PosContext((1, 4))))
    x = torch.randn(1, 16, 16)
    with pytest.raises(ValueError, match="expected x of one row"):
        attn(torch.randn(2, 16, 16), ctx=PosContext(segments=seg))
    with pytest.raises(ValueError, match="cover 16 tokens: expected the sequence's 15"):
        attn(x[:, :15], ctx=PosContext(segments=seg))
    with pytest.raises(ValueError, match=r"attn_mask has 1 entries: expected None or one per segment \(2\)"):
        attn(x, attn_mask=(None,), ctx=PosContext(segments=seg))
    with pytest.raises(ValueError, match=r"segments\[1\].start=11: expected 12"):
        attn(x, ctx=PosContext(segments=(seg[0], Segment(11, 1, PosContext((1, 4))))))
    with pytest.raises(ValueError, match="a context with a grid"):
        Segment(0, 1, PosContext())
    with pytest.raises(ValueError, match="frames >= 1"):
        Segment(0, 0, PosContext((2, 2)))
