"""The towers' packed path (vispe.models.towers._packed): mixed-size batches grouped by frame size, no
canvas. Parity with transformers' originals (tiny configs, every parameter redrawn) on packed batches
that include frames of one (merged) row or column, gradients equal to the canvas path's, a frame's
output independent of the other frames, and which path runs."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import load_compare_script
from vispe.models.vit import convert_vit

pt = load_compare_script("parity_towers")

# Qwen: h, w multiples of the merge size 2, so a "row" is one merged row (2 patches)
QWEN_THW = {"qwen2_vl": [[1, 8, 4], [1, 2, 10], [1, 10, 2], [2, 4, 4], [1, 4, 4]],
            "qwen2_5_vl": [[1, 10, 6], [1, 2, 12], [1, 12, 2], [2, 6, 4]],
            "qwen3_vl": [[1, 8, 4], [1, 2, 10], [1, 10, 2], [2, 4, 4]]}
PIXTRAL_PATCHES = [(8, 3), (1, 9), (9, 1), (8, 3), (3, 3)]  # (h, w) in patches; 1-row and 1-column images


@pytest.fixture(scope="module")
def originals():
    return {name: pt.TOWERS[name].build("tiny") for name in (*QWEN_THW, "pixtral")}


def _inputs(name, model, g):
    """(args, per-frame args) of a packed mixed-size batch for tower ``name``."""
    if name == "pixtral":
        p = model.config.patch_size
        H, W = (max(h for h, _ in PIXTRAL_PATCHES) * p, max(w for _, w in PIXTRAL_PATCHES) * p)
        x = torch.randn(len(PIXTRAL_PATCHES), 3, H, W, generator=g)
        sizes = torch.tensor([[h * p, w * p] for h, w in PIXTRAL_PATCHES])
        alone = [(x[i:i + 1, :, :h * p, :w * p], None) for i, (h, w) in enumerate(PIXTRAL_PATCHES)]
        return (x, sizes), alone
    cfg, thw = model.config, torch.tensor(QWEN_THW[name])
    n = thw.prod(-1)
    x = torch.randn(int(n.sum()), cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2, generator=g)
    alone = [(part, thw[i:i + 1]) for i, part in enumerate(x.split(n.tolist()))]
    return (x, thw), alone


@pytest.mark.parametrize("name", [*QWEN_THW, "pixtral"])
def test_packed_path_matches_the_original(name, originals):
    m = originals[name]
    args, _ = _inputs(name, m, torch.Generator().manual_seed(0))
    t = convert_vit(m)
    with torch.no_grad():
        want, got = m(*args), t(*args)
    assert t.last_path == "packed"
    fields = ["last_hidden_state"] + (["pooler_output"] if name != "pixtral" else [])
    for f in fields:
        a, b = getattr(got, f), getattr(want, f)
        assert b.abs().max() > 0.5
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    if name == "qwen3_vl":
        for a, b in zip(got.deepstack_features, want.deepstack_features, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "pixtral"])
@pytest.mark.parametrize("pe", [None, "rope_mixed"])
def test_packed_gradients_equal_the_canvas_paths(name, pe, originals):
    m = originals[name]
    args, _ = _inputs(name, m, torch.Generator().manual_seed(1))
    t = convert_vit(m, pe).double()  # float64: the two paths sum in different orders (float32 grads differ ~3e-5)
    t.train()
    grads, outs = {}, {}
    for path in ("canvas", "packed"):
        t.path = path
        t.zero_grad()
        x = args[0].double().requires_grad_(True)
        out = t(x, *args[1:]).last_hidden_state
        assert t.last_path == path
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        outs[path] = out.detach()
        grads[path] = [x.grad] + [p.grad for p in t.parameters() if p.grad is not None]
    torch.testing.assert_close(outs["packed"], outs["canvas"], rtol=0, atol=1e-5)
    assert len(grads["packed"]) == len(grads["canvas"]) > 5
    for a, b in zip(grads["packed"], grads["canvas"]):  # 1e-5 of the gradient's scale (some reach ~100)
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "pixtral"])
def test_a_frame_alone_equals_the_frame_packed(name, originals):
    m = originals[name]
    args, alone = _inputs(name, m, torch.Generator().manual_seed(2))
    t = convert_vit(m, "rope_mixed" if name == "pixtral" else None)
    with torch.no_grad():
        packed = t(*args).last_hidden_state
        single = torch.cat([t(*(a for a in one if a is not None)).last_hidden_state for one in alone], dim=-2)
    torch.testing.assert_close(packed, single, rtol=0, atol=1e-5)


def test_which_path_runs(originals):
    m = originals["qwen2_vl"]
    t = convert_vit(m)
    x = torch.randn(2 * 16, m.config.in_channels * m.config.temporal_patch_size * m.config.patch_size ** 2)
    with torch.no_grad():
        t(x, torch.tensor([[1, 4, 4], [1, 4, 4]]))  # equal sizes: the canvas
        assert t.last_path == "canvas"
        t(x, torch.tensor([[1, 4, 4], [1, 2, 8]]))
        assert t.last_path == "packed"
        t.path = "canvas"
        t(x, torch.tensor([[1, 4, 4], [1, 2, 8]]))
        assert t.last_path == "canvas"
        t.path = "packd"
        with pytest.raises(ValueError, match="path='packd': expected one of"):
            t(x, torch.tensor([[1, 4, 4], [1, 2, 8]]))


def test_qwen2_5_windows_are_index_sets_and_flex_gives_the_same(originals):
    """Qwen2.5-VL's windows on the packed path are TokenGroups (gathered, no mask) in every windowed block;
    the flex document mask (forward, CPU) gives the original's outputs too."""
    from vispe.kernels.grouped import TokenGroups

    m = originals["qwen2_5_vl"]
    args, _ = _inputs("qwen2_5_vl", m, torch.Generator().manual_seed(3))
    t = convert_vit(m)
    ops = t._windows((10, 6), None, "cpu")
    assert set(ops) == set(range(len(t.blocks))) - set(t.fullatt_block_indexes) and ops
    assert all(isinstance(op, TokenGroups) and not op.identity for op in ops.values())
    assert not isinstance(t._windows((10, 6), torch.zeros(1, 10, 6, dtype=torch.bool), "cpu")[0], TokenGroups)
    with torch.no_grad():
        want = m(*args).last_hidden_state
        t.window_impl = "flex"
        got = t(*args).last_hidden_state
    assert t.last_path == "packed"
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


# --- SigLIP2 (NaFlex): images of several sizes in padded rows -------------------------------------------------
SIGLIP2_SHAPES, SIGLIP2_L = [[3, 6], [1, 9], [9, 1], [3, 6], [2, 2], [4, 5]], 21  # 1-row and 1-column images


def _siglip2(pe=None):
    from tests.test_towers_siglip2 import hf_siglip2, packed

    hf = hf_siglip2()
    return hf, convert_vit(hf, pe), packed(SIGLIP2_SHAPES, SIGLIP2_L, seed=4)


@pytest.mark.parametrize("pe", [None, "rope_axial"])
def test_siglip2_packed_path_matches_the_original_on_valid_slots(pe):
    """Valid slots of every layer's state and the pooled output equal transformers' (native table); padded slots 0.
    With rope_axial, "auto" takes the packed path and equals the canvas path."""
    hf, m, (pv, am, ss) = _siglip2(pe)
    valid = am.bool()
    with torch.no_grad():
        if pe is None:
            want = hf(pv, am, ss, output_hidden_states=True)
            assert m(pv, am, ss).last_hidden_state is not None and m.last_path == "canvas"  # auto: every slot
            m.path = "packed"
        else:
            m.path = "canvas"
            want = m(pv, am, ss, output_hidden_states=True)
            m.path = "auto"
        got = m(pv, am, ss, output_hidden_states=True)
    assert m.last_path == "packed"
    assert want.last_hidden_state[valid].abs().max() > 0.5
    torch.testing.assert_close(got.last_hidden_state[valid], want.last_hidden_state[valid], rtol=0, atol=1e-4)
    assert (got.last_hidden_state[~valid] == 0).all()
    torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=0, atol=1e-4)
    assert len(got.hidden_states) == len(want.hidden_states) == 3
    for a, b in zip(got.hidden_states, want.hidden_states, strict=True):
        torch.testing.assert_close(a[valid], b[valid], rtol=0, atol=1e-4)


@pytest.mark.parametrize("pe", [None, "rope_mixed"])
def test_siglip2_packed_gradients_equal_the_canvas_paths(pe):
    _, m, (pv, am, ss) = _siglip2(pe)
    m = m.double().train()
    valid = am.bool()
    grads, outs = {}, {}
    for path in ("canvas", "packed"):
        m.path = path
        m.zero_grad()
        x = pv.double().requires_grad_(True)
        out = m(x, am, ss)
        assert m.last_path == path
        last = out.last_hidden_state[valid]  # (T, D) valid slots (the canvas path's padded slots differ by design)
        loss = (last * torch.linspace(-1, 1, last.numel(), dtype=last.dtype).view_as(last)).sum() \
            + out.pooler_output.square().sum()
        loss.backward()
        outs[path] = last.detach()
        grads[path] = [x.grad] + [p.grad for p in m.parameters() if p.grad is not None]
    torch.testing.assert_close(outs["packed"], outs["canvas"], rtol=0, atol=1e-5)
    assert len(grads["packed"]) == len(grads["canvas"]) > 5
    for a, b in zip(grads["packed"], grads["canvas"], strict=True):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max().item())


def test_siglip2_an_image_alone_equals_the_image_packed():
    _, m, (pv, am, ss) = _siglip2()
    m.path = "packed"
    with torch.no_grad():
        out = m(pv, am, ss)
        for b, (h, w) in enumerate(ss.tolist()):
            alone = m(pv[b:b + 1, :h * w], am[b:b + 1, :h * w], ss[b:b + 1])
            torch.testing.assert_close(out.last_hidden_state[b, :h * w], alone.last_hidden_state[0], rtol=0, atol=1e-5)
            torch.testing.assert_close(out.pooler_output[b], alone.pooler_output[0], rtol=0, atol=1e-5)


# --- Idefics3 (images padded into one batch) and Llama 4 (tiles of one size) ---------------------------------
IDEFICS3_RECTS = [(7, 3), (1, 9), (9, 1), (7, 3), (4, 5)]  # (h, w) patches of each image in a 9x9-patch batch


def _idefics3(pe=None):
    from tests.test_towers_siglip2 import hf_idefics3

    hf = hf_idefics3()
    pm = torch.zeros(len(IDEFICS3_RECTS), 9, 9, dtype=torch.bool)
    for b, (h, w) in enumerate(IDEFICS3_RECTS):
        pm[b, :h, :w] = True
    x = torch.randn(len(IDEFICS3_RECTS), 3, 36, 36, generator=torch.Generator().manual_seed(5))
    return hf, convert_vit(hf, pe), x * pm.repeat_interleave(4, 1).repeat_interleave(4, 2)[:, None], pm


def test_idefics3_packed_path_matches_the_original_on_valid_patches_and_alone():
    hf, m, x, pm = _idefics3()
    valid = pm.flatten(1)
    with torch.no_grad():
        want = hf(x, pm, output_hidden_states=True)
        assert m(x, pm).last_hidden_state is not None and m.last_path == "canvas"  # auto: every patch
        m.path = "packed"
        got = m(x, pm, output_hidden_states=True)
        assert m.last_path == "packed"
        assert want.last_hidden_state[valid].abs().max() > 0.5
        torch.testing.assert_close(got.last_hidden_state[valid], want.last_hidden_state[valid], rtol=0, atol=1e-4)
        assert (got.last_hidden_state[~valid] == 0).all()
        for a, b in zip(got.hidden_states, want.hidden_states, strict=True):
            torch.testing.assert_close(a[valid], b[valid], rtol=0, atol=1e-4)
        for b, (h, w) in enumerate(IDEFICS3_RECTS):  # alone = packed
            alone = m(x[b:b + 1, :, :4 * h, :4 * w]).last_hidden_state[0]  # (h*w, C), no mask
            torch.testing.assert_close(got.last_hidden_state[b].view(9, 9, -1)[:h, :w].reshape(h * w, -1), alone,
                                       rtol=0, atol=1e-5)


@pytest.mark.parametrize("pe", [None, "rope_mixed"])
def test_idefics3_packed_gradients_equal_the_canvas_paths(pe):
    _, m, x0, pm = _idefics3(pe)
    m = m.double().train()
    valid = pm.flatten(1)
    grads, outs = {}, {}
    for path in ("canvas", "packed"):
        m.path = path
        m.zero_grad()
        x = x0.double().requires_grad_(True)
        last = m(x, pm).last_hidden_state[valid]  # (T, C) valid patches
        assert m.last_path == path
        (last * torch.linspace(-1, 1, last.numel(), dtype=last.dtype).view_as(last)).sum().backward()
        outs[path] = last.detach()
        grads[path] = [x.grad] + [p.grad for p in m.parameters() if p.grad is not None]
    torch.testing.assert_close(outs["packed"], outs["canvas"], rtol=0, atol=1e-5)
    assert len(grads["packed"]) == len(grads["canvas"]) > 5
    for a, b in zip(grads["packed"], grads["canvas"], strict=True):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max().item())


def test_llama4_tiles_are_one_size_so_the_canvas_is_the_packed_path():
    """Llama 4 takes (B, 3, H, W) tiles: "auto" runs the canvas (one group, no padding), "packed" the same call."""
    m = pt.TOWERS["llama4"].build("tiny")
    t = convert_vit(m)
    s = m.config.image_size
    x = torch.randn(3, 3, s, s, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = m(x).last_hidden_state
        canvas = t(x).last_hidden_state
        assert t.last_path == "canvas"
        t.path = "packed"
        packed = t(x).last_hidden_state
        assert t.last_path == "packed"
    torch.testing.assert_close(canvas, want, rtol=0, atol=1e-4)
    torch.testing.assert_close(packed, canvas, rtol=0, atol=0)


def test_the_kernel_report_reads_the_gathered_windows_as_the_fused_kernel_and_flex_as_flex(originals):
    """On the CPU: the windows gathered run SDPA's fused kernel (no math kernel, no mask); flex is named flex."""
    from vispe.kernels.explain import explain

    m = originals["qwen2_5_vl"]
    args, _ = _inputs("qwen2_5_vl", m, torch.Generator().manual_seed(7))
    t = convert_vit(m)
    kernels = {}
    for impl in ("gather", "flex"):
        t.window_impl = impl
        with torch.no_grad():
            kernels[impl] = {r.layer: r.kernel for r in explain(t, *args)}
    for i in range(len(t.blocks)):
        windowed = i not in t.fullatt_block_indexes
        assert kernels["gather"][f"blocks.{i}.attn"] == "flash"
        assert kernels["flex"][f"blocks.{i}.attn"] == ("flex" if windowed else "flash")
