"""The CUDA tier, checked on the CPU (issue 54): what can be checked without a GPU is checked here.

* ``pytest -m gpu`` collects the tier, parametrised over the registry (every encoding in each per-encoding
  test, every design of the detector's registries), and on a machine without CUDA skips it with one line
  saying why (``-rs`` too);
* every case builds and runs on the CPU: the ViT and detector cases (with the bf16 bound, calibrated under
  CPU autocast, holding there), the position math in float32 under CPU autocast, the kernel report's cases,
  vispe's kernels against their references, the DDP command's config;
* ``bench/gpu_check.py --dry-run`` (also a step of ``.ci/run``) builds every case and says what it would run.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import gpu_cases as G
import pytest
import test_gpu_compile_ddp as GC
import test_gpu_kernels as GK
import test_gpu_parity as GP
import torch
from gpu_kernel_cases import FORCED, KERNEL_CASES, device_backends, kernel_model

import vispe
from vispe.kernels.explain import KERNELS

ROOT = Path(__file__).resolve().parents[1]
TIER = ["tests/test_gpu_parity.py", "tests/test_gpu_kernels.py", "tests/test_gpu_compile_ddp.py"]
#: the tier's tests that take every registered encoding, and the parameter that carries it
PER_ENCODING = ("test_vit_on_cuda_equals_cpu_in_float32", "test_vit_bf16_autocast_within_the_bound",
                "test_compiled_vit_runs_three_sizes_without_recompiling", "test_the_kernel_report_names_the_kernel_the_gpu_ran",
                "test_detector_on_cuda_equals_cpu_in_float32", "test_detector_bf16_autocast_within_the_bound")


def _no_cuda_env() -> dict:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def tier_run():
    """``pytest -m gpu -rs -v`` over the tier's files, on a machine (or a process) without CUDA."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-rs", "-v", "-p", "no:cacheprovider",
                           "-p", "no:randomly", *TIER], cwd=ROOT, env=_no_cuda_env(), capture_output=True, text=True,
                          timeout=300)
    return proc


@pytest.mark.slow
def test_pytest_m_gpu_collects_the_tier_over_the_registry_and_skips_it_with_one_line(tier_run):
    out = tier_run.stdout
    assert tier_run.returncode == 0, out[-3000:] + tier_run.stderr[-3000:]
    ids = re.findall(r"^(tests/test_gpu_\w+\.py::\S+) SKIPPED", out, re.M)
    assert len(ids) >= 8 * len(vispe.available()) and f"= {len(ids)} skipped" in out, len(ids)
    for test in PER_ENCODING:
        params = [i.split("[", 1)[1] for i in ids if f"::{test}[" in i]
        for name in vispe.available():
            assert any(name in p.rstrip("]").split("-") for p in params), f"{test} does not take {name}"
    designs = G.detector_designs()
    assert set(designs) == {"dense", "deformable"} and len(designs["dense"]) >= 3
    for op, ds in designs.items():
        for d in ds:
            assert any(f"-{d}-{op}]" in i for i in ids if "test_detector_on_cuda" in i), (op, d)
    why = G.skip_reason()
    assert why is not None and why.startswith("gpu tier:")
    summary = [line for line in out.splitlines() if line.startswith("gpu tier:")]
    assert summary == [f"gpu tier: {len(ids)} tests skipped: {why.split('gpu tier:', 1)[1].strip()}"], summary
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED [")]
    assert len(skipped) == 1 and f"SKIPPED [{len(ids)}] tests/gpu_cases.py:1: " in skipped[0], skipped


def test_a_gpu_machine_would_not_skip():
    """The skip is for want of CUDA alone: with a GPU the reason is None."""
    assert (G.skip_reason() is None) == torch.cuda.is_available()


# ------------------------------------------------------------------------------ every case builds
@pytest.mark.parametrize("name", G.ENCODINGS)
def test_vit_case_builds_and_its_bf16_bound_holds_on_cpu(name):
    err = G.bf16_error(lambda: G.vit(name), G.vit_batch, G.vit_outputs, "cpu")
    assert 0 < err <= G.BF16_REL, err  # 0 would mean autocast did nothing


@pytest.mark.parametrize("case", GP.DETECTORS, ids=GP.DET_IDS)
def test_detector_case_builds_and_its_bf16_bound_holds_on_cpu(case):
    err = G.bf16_error(lambda: G.detector(*case), G.detector_batch, G.detector_outputs, "cpu")
    assert 0 < err <= G.BF16_REL, err


def test_parity_compares_values():
    """The CUDA-against-CPU measure sees a changed weight (here: CPU against a perturbed copy)."""
    model = G.vit("sine")
    x, mask = G.vit_batch("cpu")
    with torch.no_grad():
        want = G.vit_outputs(model, x, mask)
        G.perturbed(model, scale=1e-3, seed=1)
        assert G.tol_used(G.vit_outputs(model, x, mask), want) > 1.0
        assert G.tol_used(want, want) == 0.0


@pytest.mark.parametrize("name", GP.FLOAT32_MATH)
def test_position_math_is_float32_under_cpu_autocast(name):
    assert GP.check_float32_position_math(name, "cpu") >= 1


@pytest.mark.parametrize("case", KERNEL_CASES, ids=[c.label for c in KERNEL_CASES])
def test_kernel_report_case_builds_and_reports_on_cpu(case):
    """Each case's model and report run on the CPU (without its forced CUDA backend; flex forward only: torch
    has no CPU backward for it); every layer gets a kernel the report knows."""
    from dataclasses import replace

    from vispe.kernels.explain import explain

    m, report, _ = kernel_model(replace(case, backend=None), "cpu")
    if case.bias_impl == "flex":
        x, mask = G.vit_batch("cpu")
        with torch.no_grad():
            rows = explain(m, x, mask=mask)
    else:
        rows = report()
    words = {k for _, k in KERNELS}
    assert rows and all(set(r.kernel.split("+")) <= words for r in rows), [r.kernel for r in rows]


def test_forced_cases_name_every_kernel_of_the_report_but_cudnn():
    assert {c.expect.split("+")[0] for c in FORCED} == {"flash", "efficient", "math", "flex", "chunked"}


def test_device_kernel_names_are_classified():
    """CUDA kernel names as the profiler records them (torch 2.x builds) map to their backend."""
    assert device_backends(["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>(Flash_fwd_params)"]) == {"flash"}
    assert device_backends(["fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float>::Params)",
                            "fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)"]) \
        == {"efficient"}
    assert device_backends(["triton_tem_fused_0", "triton_poi_fused_1"]) == {"flex"}
    assert device_backends(["void (anonymous namespace)::softmax_warp_forward<float>", "ampere_sgemm_64x64_nn"]) == {"math"}
    assert device_backends(["ampere_sgemm_64x64_nn"]) == set()


def test_vispe_kernels_against_their_references_on_cpu():
    assert GK.check_deformable("cpu") == 0.0  # the same code on one device: the plumbing runs
    assert GK.BLOCKS and all(GK.check_block_rotations(n, "cpu") == 0.0 for n in GK.BLOCKS)
    assert {vispe.family_of(n) for n in GK.BLOCKS} == {"rotary"}
    for impl in GK.RELATIVE_IMPLS:
        if impl != "flex":  # no CPU backward
            assert GK.check_relative(impl, "cpu") <= 1.0, impl  # the kernel against the dense bias's SDPA
    for impl in ("reference", "chunked", "auto"):
        assert GK.check_dense_bias(impl, "cpu") <= 1.0, impl


def test_the_ddp_command_is_a_valid_train_config():
    from conftest import load_script
    from vispe.train import config as C

    train = load_script("train.py", "vispe_train_for_gpu_tier")
    words = GC.ddp_command("/tmp/out")
    args = train.parse_args(words[words.index(str(ROOT / "train.py")) + 1:])
    cfg = C.load_config(ROOT / args.config if args.config else train.DEFAULT_CONFIG, args.overrides)
    assert cfg.train.device == "cuda" and cfg.train.amp == "bf16"


@pytest.mark.slow
def test_the_compile_check_runs_on_cpu():
    """The compile case trains at three sizes on the CPU, dynamo's eager backend (no code generation):
    one frame at every size, no recompile."""
    assert GC.compiled_sizes("rope_mixed", "cpu", train=True, backend="eager") == [1, 1, 1]
