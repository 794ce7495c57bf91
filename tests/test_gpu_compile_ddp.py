"""CUDA tier (marker ``gpu``): torch.compile with Inductor's GPU backend, and data-parallel training over NCCL.

* every registered encoding in a ViT, compiled once with ``dynamic=True``, runs three non-square sizes
  without recompiling (a constant number of compiled frames, no recompile counted), each against eager
  (on the CPU with dynamo's eager backend: one frame at every size for all of them, 2026-11-28);
  three of them (one rotary with learned angles, one relative bias, one additive) also train through the
  compiled model (input gradients against eager);
* two processes of ``train.py`` under torchrun on two GPUs: NCCL's all-reduce, one training run's summary
  (skipped with fewer than two GPUs, saying so).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gpu_cases import ENCODINGS, no_tf32, skip_reason, vit

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]
ROOT = Path(__file__).resolve().parents[1]
#: three sizes (H, W) in pixels, patch 4: 4 x 5, 6 x 4 and 5 x 7 patches, the first not square
SIZES = [(16, 20), (24, 16), (20, 28)]
#: compiled and trained: learned RoPE angles, a relative-bias table, a fixed additive code
TRAINED = ("rope_mixed", "relbias", "sine")


def compiled_sizes(name: str, device, *, train: bool = False, backend: str = "inductor") -> list[int]:
    """The compiled-frame count after each of ``SIZES`` (dynamo's counter; ``backend`` compiles), outputs
    and, training, input gradients checked against eager on ``device``."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = vit(name, img=SIZES[0]).to(device).train(train)
    cnt = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=cnt, dynamic=True)
    counts = []
    with no_tf32():
        for i, size in enumerate(SIZES):
            x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(i)).to(device).requires_grad_(train)
            with torch.set_grad_enabled(train):
                out, want = compiled(x), model(x)
            torch.testing.assert_close(out, want, rtol=1e-3, atol=1e-3)
            if train:
                g_c, = torch.autograd.grad(out.square().sum(), x)
                g_e, = torch.autograd.grad(want.square().sum(), x)
                torch.testing.assert_close(g_c, g_e, rtol=1e-3, atol=1e-3)
            counts.append(cnt.frame_count)
    assert not counters["recompiles"], f"{name}: recompiled: {dict(counters['recompiles'])}"
    return counts


@pytest.mark.parametrize("name", ENCODINGS)
def test_compiled_vit_runs_three_sizes_without_recompiling(name):
    counts = compiled_sizes(name, "cuda")
    assert counts == [counts[0]] * 3, f"{name}: compiled frames after each size {counts}"


@pytest.mark.parametrize("name", TRAINED)
def test_compiled_vit_trains_at_three_sizes_without_recompiling(name):
    """No recompile, and nothing new to compile at the third size. A learned table resized while it trains
    (relbias) is resized outside the graph (tests/test_compile.py): the frames around those graph breaks
    are first compiled at the first size that resizes (on the CPU: 22, 27, 27 frames for relbias)."""
    counts = compiled_sizes(name, "cuda", train=True)
    assert counts[1] == counts[2] and (counts[0] == counts[1] or name == "relbias"), \
        f"{name}: compiled frames after each size {counts}"


DDP_ARGS = ["data.kwargs.n_train=64", "data.kwargs.n_test=37", "data.batch_size=16", "data.eval_batch_size=5",
            "model.embed_dim=32", "model.num_heads=2", "model.depth=2", "train.epochs=1", "train.progress=false",
            "train.compare=[]", "train.device=cuda", "train.amp=bf16", "train.run_name=ddp"]


def ddp_command(out_dir) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            str(ROOT / "train.py"), f"train.out_dir={out_dir}", *DDP_ARGS]


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                    reason=f"NCCL DDP needs two GPUs; this machine has {torch.cuda.device_count()}")
def test_two_process_nccl_ddp_step_of_train_py(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(ddp_command(tmp_path), env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(next((tmp_path / "ddp").glob("*/summary.json")).read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2  # 64 samples / 2 ranks / 16 per batch
    assert "CUDA" in summary["device"], summary["device"]
    assert proc.stdout.count("final:") == 1  # rank 0 alone reports
