"""vispe.audit on small models written here, one planted defect per kind, and on vispe ViTs with
every registered encoding (no false defect; the family named right); weights and modes unchanged."""
from __future__ import annotations

import pytest
import torch
from _audit_models import Tiny, TinyMasked

import vispe
from vispe.__main__ import mask_awareness
from vispe.audit import audit
from vispe.models.vit import create_vit
from vispe.registry import available, get


def kinds(report) -> list[str]:
    return [d.kind for d in report.defects]


def test_vispe_audit_is_callable_and_a_package():
    rep = vispe.audit(Tiny("table").eval())
    assert isinstance(rep, vispe.audit.Report) and rep.family == "additive"
    assert vispe.audit.audit is audit


def test_correct_table_is_resampled_and_has_no_defect():
    rep = audit(Tiny("table"), native=(32, 32))
    assert rep.defects == [] and rep.family == "additive"
    assert any("resampled (the new code" in d for d in rep.entries[0].details), rep.text()


def test_planted_table_resampled_to_w_h_on_non_square_grids():
    rep = audit(Tiny("table_transposed"), native=(32, 32))
    assert kinds(rep) == ["table"], rep.text()
    assert "resampled to (w, h) and read as (h, w)" in rep.defects[0].text


def test_rope_is_named_and_relative():
    rep = audit(Tiny("rope"), native=(32, 32))
    assert rep.defects == [] and rep.family == "rotary", rep.text()
    details = "\n".join(rep.entries[0].details)
    assert "pair layout: half" in details and "integer patch index" in details
    assert "equals vispe rope_axial with layout=half, axis_order=yx, base=100 " in details


def test_planted_wrong_pair_layout():
    rep = audit(Tiny("rope_wrong_layout"), native=(32, 32))
    assert kinds(rep) == ["rotary"], rep.text()


def test_planted_swapped_grid_fails_the_shift_test_on_non_square_grids_only():
    rep = audit(Tiny("rope_swapped"), native=(32, 32))
    assert kinds(rep) == ["relative"], rep.text()
    assert "at 8x12 patches" in rep.defects[0].text  # the non-square grid
    assert any("shift test at 8x8" in d and "(relative)" in d for d in rep.entries[0].details)


def test_planted_mask_ignored_padded_differs_from_alone():
    rep = audit(TinyMasked("mask_ignored"), native=(32, 32))
    assert kinds(rep) == ["padding"], rep.text()


def test_mask_aware_sine_padded_equals_alone():
    rep = audit(TinyMasked("sine_masked"), native=(32, 32))
    assert rep.defects == [], rep.text()
    assert any(f.topic == "padding" and "difference" in f.text for f in rep.findings)


def test_audit_leaves_weights_and_modes_unchanged():
    m = create_vit("vit_cifar", pe="relbias_axis", img_size=32, patch_size=4, num_classes=10, depth=2,
                   embed_dim=32, num_heads=2)
    m.train()
    m.blocks[1].eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    modes = {n: mod.training for n, mod in m.named_modules()}
    impls = {n: mod.bias_impl for n, mod in m.named_modules() if hasattr(mod, "bias_impl")}
    audit(m)
    assert {n: mod.training for n, mod in m.named_modules()} == modes
    assert {n: mod.bias_impl for n, mod in m.named_modules() if hasattr(mod, "bias_impl")} == impls
    after = m.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="model is a str"):
        audit("vit")
    with pytest.raises(ValueError, match="dtype=torch.int64"):
        audit(Tiny(), dtype=torch.int64)
    with pytest.raises(ValueError, match="sizes="):
        audit(Tiny(), sizes=[(32,)])


def test_report_renders_text_and_markdown():
    rep = audit(Tiny("table_transposed"), native=(32, 32))
    assert "defects:\n  [table]" in rep.text() and "fix: resample by target size" in rep.text()
    md = rep.markdown()
    assert md.startswith("**Tiny: position additive;") and "\n- [table] " in md
    assert "\n    - evidence: " in md and "\n    - fix: " in md


# family each encoding is named as (conditional: PEG after block 0; the mask-aware option set where it has one)
FAMILY = {"additive": "additive", "rotary": "rotary", "bias": "bias", "conditional": "conditional", "none": "none"}
NOT_RELATIVE = {"liere", "string", "comrope"}  # orthogonal blocks: relative only with 2x2 blocks


@pytest.mark.slow
def test_every_vispe_encoding_in_a_vispe_vit_no_false_defect():
    seen, not_mask_aware = [], []
    for name in available():
        cls = get(name)
        kw = {}
        if cls.mask_aware_option and "mask_aware" in cls.mask_aware_option:
            kw["mask_aware"] = True
        if name in ("relbias", "relpos_decomposed", "learned_abs"):
            kw["grid"] = (4, 4)
        m = create_vit("vit_cifar", pe=name, img_size=16, patch_size=4, num_classes=10, depth=2, embed_dim=32,
                       num_heads=2, pe_kwargs=kw)
        with torch.no_grad():  # zero-initialised tables (iRPE, as its paper) carry no position yet: draw them
            for p in m.parameters():
                if not p.any():
                    p.normal_(std=0.5)
        rep = audit(m)
        # the one defect allowed: an image padded differs from it alone where vispe itself says the
        # encoding is not mask-aware (log_cpb, relbias, relpos_decomposed: sized by the padded grid)
        assert [d.kind for d in rep.defects] in ([], ["padding"]), (name, rep.text())
        if rep.defects:
            assert mask_awareness(cls) == "no", (name, rep.text())
            not_mask_aware.append(name)
        assert rep.families == [FAMILY[cls.family]], (name, rep.text())
        seen.append(name)
    assert set(seen) == set(available())
    assert not_mask_aware == ["log_cpb", "relbias", "relpos_decomposed"]  # tables sized by the padded grid


def test_learned_abs_without_mask_awareness_is_a_padding_defect():
    m = create_vit("vit_cifar", pe="learned_abs", img_size=32, patch_size=4, num_classes=10, depth=1,
                   embed_dim=32, num_heads=2)
    rep = audit(m)
    assert kinds(rep) == ["padding"], rep.text()
