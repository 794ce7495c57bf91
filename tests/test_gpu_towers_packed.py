"""CUDA tier (marker ``gpu``): the converted towers' packed path on CUDA (issue 55). Written without a GPU:
unverified on one until ``bench/gpu_check.py`` runs on a lent machine.

* Qwen2-VL, Qwen2.5-VL (windows as index sets, ``vispe.kernels.grouped``) and SigLIP2 on packed batches of
  mixed sizes (frames grouped by size, SDPA per group: the CUDA path of the packed towers): CUDA equals the
  CPU in float32 (TF32 off), outputs and the input's gradient;
* Qwen2.5-VL's windows through ``flex_attention``'s document mask (``window_impl="flex"``, compiled on CUDA)
  equal the gathered windows, forward and backward;
* the kernel report (``vispe.kernels.explain``) names flex in the windowed blocks with ``window_impl="flex"``.
"""
from __future__ import annotations

import pytest
import torch
from gpu_cases import F32_TOL, no_tf32, skip_reason

from tests.conftest import load_compare_script
from vispe.kernels.explain import explain
from vispe.models.vit import convert_vit

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

QWEN_THW = [[1, 10, 6], [1, 2, 12], [1, 12, 2], [2, 6, 4]]  # one merged row and column, partial windows
SIGLIP2 = ([[3, 6], [1, 9], [9, 1], [3, 6], [2, 2]], 21)


def tower_case(name: str, device: str):
    """(original, converted tower, inputs) of ``name`` on ``device``, a packed batch of mixed sizes."""
    g = torch.Generator().manual_seed(0)
    if name == "siglip2":
        from tests.test_towers_siglip2 import hf_siglip2, packed

        hf = hf_siglip2()
        args = packed(*SIGLIP2, seed=1)
        t = convert_vit(hf, "rope_mixed")  # "auto": the packed path
    else:
        hf = load_compare_script("parity_towers").TOWERS[name].build("tiny")
        cfg, thw = hf.config, torch.tensor(QWEN_THW)
        x = torch.randn(int(thw.prod(-1).sum()), cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2,
                        generator=g)
        args = (x, thw)
        t = convert_vit(hf)
    return hf.to(device), t.to(device), tuple(a.to(device) for a in args)


def out_and_grad(t, args):
    x = args[0].clone().requires_grad_(True)
    out = t(x, *args[1:]).last_hidden_state
    (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    assert t.last_path == "packed"
    return out.detach().cpu(), x.grad.cpu()


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "siglip2"])
def test_packed_tower_on_cuda_equals_cpu_in_float32(name):
    with no_tf32():
        _, cpu, args = tower_case(name, "cpu")
        _, gpu, gargs = tower_case(name, "cuda")
        for a, b in zip(out_and_grad(cpu, args), out_and_grad(gpu, gargs), strict=True):
            torch.testing.assert_close(b, a, rtol=F32_TOL, atol=F32_TOL)


def test_qwen2_5_flex_windows_equal_the_gathered_ones_forward_and_backward():
    with no_tf32():
        _, t, args = tower_case("qwen2_5_vl", "cuda")
        gathered = out_and_grad(t, args)
        t.zero_grad()
        t.window_impl = "flex"
        flex = out_and_grad(t, args)
    for a, b in zip(flex, gathered, strict=True):
        torch.testing.assert_close(a, b, rtol=F32_TOL, atol=F32_TOL)


def test_the_kernel_report_names_flex_in_the_windowed_blocks():
    _, t, args = tower_case("qwen2_5_vl", "cuda")
    t.window_impl = "flex"
    rows = {r.layer: r for r in explain(t, *args, backward=True)}
    for i in range(len(t.blocks)):  # full-attention blocks: torch's SDPA choice (flash, efficient, cudnn)
        windowed = i not in t.fullatt_block_indexes
        assert ("flex" in rows[f"blocks.{i}.attn"].forward) == windowed, (i, rows[f"blocks.{i}.attn"].kernel)
