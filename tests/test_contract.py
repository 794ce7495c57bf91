"""The contract every registered encoding gets automatically (issue 19, item 13).

Nothing here can pass vacuously: ``CONTRACT`` names every registered encoding with what is expected
of it (a test fails when an encoding is registered without an entry), each check compares values,
and encodings exempt from a property are listed with the reason, and checked to really lack it.

* float32 math under bf16 autocast, with the cache cleared and the requested dtype honoured;
* a change to any learned parameter changes the output (no stale cache), in train and eval mode;
* a checkpoint saved at a 3x5 grid loads at 5x3 by the encoding's own rule (issue 19, item 11);
* the interleaved RoPE layout through ``Attention`` equals rotate-half with permuted weights.

ViT-level contracts (batch invariance with padding, timm parity) are in ``test_contract_vit.py``.
"""
from __future__ import annotations

import copy

import pytest
import torch

import vispe
from vispe.attention import Attention, PosContext
from vispe.axis.rope import half_to_interleaved
from vispe.encoding import GRID_KEY
from vispe.registry import build_in

DIM, HEADS, HD = 16, 2, 8

#: every registered encoding: (family, learned parameters in its default build, grid-sized tables)
CONTRACT = {
    "none": ("none", False, False),
    "sine": ("additive", False, False),
    "sincos2d": ("additive", False, False),
    "axis2d": ("additive", False, False),  # sinusoidal by default; the learned axis is a CASE below
    "fourier": ("additive", False, False),  # fixed frequencies by default; learnable is a CASE below
    "normidx2d": ("additive", True, False),
    "learned_abs": ("additive", True, True),
    "learned_rowcol": ("additive", True, True),
    "rope_axial": ("rotary", False, False),
    "rope_mixed": ("rotary", True, False),
    "relbias": ("bias", True, True),
    "relbias_axis": ("bias", True, False),
    "irpe": ("bias", True, False),
    "relpos_decomposed": ("bias", True, True),  # SAM's per-axis tables, (2h-1, d) and (2w-1, d): grid-sized
    "log_cpb": ("bias", True, False),
    "peg": ("conditional", True, False),
}
#: the default build of every registered name, plus variants that learn or index differently
CASES = [(name, {}) for name in CONTRACT] + [
    ("axis2d", dict(axis="learned")), ("fourier", dict(learnable=True, mlp_dim=8)),
    ("fourier", dict(mask_aware=True, coords="normalized")), ("irpe", dict(contextual=True)),
    ("irpe", dict(method="cross")), ("relbias_axis", dict(index="t5")), ("sine", dict(normalize=False)),
    ("log_cpb", dict(pretrained_window=(4, 4))), ("peg", dict(padding_mode="circular")),
    ("rope_axial", dict(scaling="yarn", ref_grid=(2, 3))), ("rope_mixed", dict(scaling="pi", ref_grid=(2, 3))),
    ("sine", dict(center=True)), ("sincos2d", dict(center=True, mask_aware=True)),
    ("normidx2d", dict(center=True, mask_aware=True)),
]
IDS = [name + "".join(f"-{k}={v}" for k, v in kw.items()) for name, kw in CASES]


def build(name, grid=(4, 6), prefix=1, **kw):
    torch.manual_seed(0)
    ctx = dict(dim=DIM, num_heads=HEADS, head_dim=HD, grid=grid, num_prefix_tokens=prefix)
    pe = build_in(name, ctx, **kw)
    with torch.no_grad():  # zero-initialised tables (iRPE, prefix scalars) would hide differences
        for p in pe.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return pe


def outputs(pe, shape=(3, 5), mask=None, dtype=torch.float32, x=None):
    """Everything the encoding produces at ``shape`` (a list of tensors; [] for "none")."""
    fam, N = pe.family, shape[0] * shape[1]
    if fam == "additive":
        pre = pe.prefix(dtype=dtype)
        return [pe(shape, mask, dtype=dtype)] + ([pre] if pre is not None else [])
    if fam == "rotary":
        return [pe(shape, mask)]
    if fam == "bias":
        q = None
        if pe.contextual:
            q = torch.randn(1 if mask is None else mask.shape[0], HEADS, pe.num_prefix_tokens + N, HD,
                            generator=torch.Generator().manual_seed(1))
        return [pe(shape, mask, dtype=dtype, **({"q": q} if q is not None else {}))]
    if fam == "conditional":
        if x is None:
            x = torch.randn(1 if mask is None else mask.shape[0], DIM, *shape, generator=torch.Generator().manual_seed(2))
        return [pe(x.to(dtype), mask)]
    assert fam == "none" and pe(shape, mask) is None
    return []


def test_every_registered_encoding_has_a_contract_entry():
    """A new encoding must be placed in CONTRACT (its family, whether it learns, its grid tables)
    and thus in every value check of this file and of test_contract_vit.py."""
    from test_contract_vit import VIT_INVARIANCE

    names = set(vispe.available())
    assert set(CONTRACT) == names, f"add to CONTRACT: {sorted(names - set(CONTRACT))}; gone: {sorted(set(CONTRACT) - names)}"
    assert set(VIT_INVARIANCE) == names, f"add to test_contract_vit.VIT_INVARIANCE: {sorted(names - set(VIT_INVARIANCE))}"
    for name, (family, learns, grid_tables) in CONTRACT.items():
        assert vispe.family_of(name) == family, name
        pe = build(name, prefix=0)  # additive prefix vectors aside
        assert (sum(p.numel() for p in pe.parameters()) > 0) == learns, name
        assert (pe.table_grid() is not None) == grid_tables, name
    assert {n for n, _ in CASES} == names


@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_float32_math_under_bf16_autocast_and_the_requested_dtype(name, kw):
    """The bf16 result is the float32 one rounded once, recomputed (cache cleared), and the dtype asked
    for is the dtype returned; rotary angles stay float32. PEG, a learned convolution of the
    features, follows autocast like any convolution (documented exception): checked to tolerance."""
    pe = build(name, **kw).eval()
    mask = torch.zeros(2, 3, 5, dtype=torch.bool)
    mask[0, 2:] = True
    mask[1, :, 3:] = True
    checked = 0
    for m in (None, mask):
        ref = outputs(pe, mask=m)
        for want in (torch.float64, torch.float16, torch.bfloat16) if pe.family != "conditional" else (torch.float32,):
            pe._cache.clear()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                low = outputs(pe, mask=m, dtype=want)
            assert len(low) == len(ref)
            for a, b in zip(low, ref):
                if pe.family == "rotary":
                    assert a.dtype == torch.float32 and torch.equal(a, b)
                elif pe.family == "conditional":  # x float32 in, the convolution runs in bf16
                    torch.testing.assert_close(a.float(), b, rtol=3e-2, atol=3e-2)
                else:
                    assert a.dtype == want, f"asked for {want}, got {a.dtype}"
                    assert torch.equal(a, b.to(want)), f"not the float32 result cast to {want}"
                checked += 1
    assert checked > 0 or pe.family == "none"


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_a_change_to_any_learned_parameter_changes_the_output(name, kw, mode):
    pe = build(name, **kw).train(mode == "train")
    for pname, p in pe.named_parameters():
        before = [t.clone() for t in outputs(pe)]  # fills any cache
        with torch.no_grad():
            p.add_(0.5)  # in place, as an optimiser step
        after = outputs(pe)
        assert any((a.float() - b.float()).abs().max() > 1e-6 for a, b in zip(after, before)), \
            f"{name}: changing {pname} did not change the output (stale cache?)"


def test_learned_variants_are_checked_for_stale_caches():
    learned = [(n, kw) for n, kw in CASES if any(True for _ in build(n, **kw).parameters())]
    assert len(learned) >= 12  # every learned default build and the learned variants


@pytest.mark.parametrize("name, kw", CASES, ids=IDS)
def test_checkpoint_saved_at_3x5_loads_at_5x3_by_the_encodings_own_rule(name, kw):
    table = (lambda g: {"max_size": g}) if name == "learned_rowcol" else (lambda g: {})  # its grid option
    src = build(name, grid=(3, 5), **table((3, 5)), **kw).eval()
    sd = src.state_dict()
    dst = build(name, grid=(5, 3), **table((5, 3)), **kw).eval()
    with torch.no_grad():
        for p in dst.parameters():
            p.add_(1.0)  # make sure loading overwrites everything
    dst.load_state_dict(sd)
    want = copy.deepcopy(src).resize_((5, 3))  # the encoding's own rule at load time
    if src.table_grid() is not None:
        assert sd[GRID_KEY].tolist() == [3, 5] and dst.table_grid() == (5, 3)
    for shape in ((5, 3), (4, 2), (2, 3)):  # the new grid and grids within it, both orientations
        for a, b in zip(outputs(dst, shape), outputs(want, shape)):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", vispe.available("rotary"))
def test_interleaved_rope_layout_through_attention_equals_rotate_half_with_permuted_weights(name):
    """An Attention whose q/k channels are laid out interleaved gives the same output as the
    rotate-half one: the layout option reaches the rotation (timm#2692)."""
    half = build(name, prefix=1, layout="half").eval()
    inter = build(name, prefix=1, layout="interleaved").eval()
    inter.load_state_dict(half.state_dict())
    torch.manual_seed(1)
    a = Attention(DIM, HEADS, qkv_bias=True, pe=half)
    b = Attention(DIM, HEADS, qkv_bias=True, pe=inter)
    perm = half_to_interleaved(torch.arange(HD))  # channel order of a head in the interleaved layout
    rows = torch.arange(3 * DIM).view(3, HEADS, HD)
    rows[:2] = rows[:2, :, perm]  # q and k rows of every head; v unchanged
    with torch.no_grad():
        b.load_state_dict(a.state_dict())
        b.qkv.weight.copy_(a.qkv.weight[rows.flatten()])
        b.qkv.bias.copy_(a.qkv.bias[rows.flatten()])
    x = torch.randn(2, 1 + 12, DIM)
    ctx = PosContext((3, 4), 1)
    torch.testing.assert_close(b(x, ctx=ctx), a(x, ctx=ctx), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        inter.layout = "half"  # the permuted weights with the other pairing: not the same
        assert (b(x, ctx=ctx) - a(x, ctx=ctx)).abs().max() > 1e-4
