"""bench/gpu_check.py on the CPU: the plan it runs on a GPU, its budgets, its timing loop and results file.

The dry run itself (every case built and run tiny, the tier collected) is a step of ``.ci/run``.
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
import torch

import vispe

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import _gpu_timing as T  # noqa: E402
import gpu_check  # noqa: E402


def test_the_budgets_fit_eight_minutes_and_cover_every_stage():
    assert set(gpu_check.BUDGETS) == {*gpu_check.TIER, "vit timing", "detector timing"}
    assert sum(gpu_check.BUDGETS.values()) <= 8 * 60 - 30  # half a minute for start-up and the results file


def test_the_compile_stage_covers_every_family_and_full_every_encoding():
    picks = gpu_check.compile_picks()
    assert {vispe.family_of(n) for n in picks} == {vispe.family_of(n) for n in vispe.available()}
    (_, short), = [c for c in gpu_check.tier_commands(False) if c[0].endswith("compile_ddp.py")]
    (_, full), = [c for c in gpu_check.tier_commands(True) if c[0].endswith("compile_ddp.py")]
    assert [a for a in short if "[" in a] == [f"{gpu_check.COMPILE}[{n}]" for n in picks]
    assert full[-1] == "tests/test_gpu_compile_ddp.py"  # the whole file: every encoding
    assert all(args[:2] == ["-m", "gpu"] for _, args in gpu_check.tier_commands(False))


def test_time_cases_times_what_builds_and_notes_the_rest():
    calls = {"a": 0, "b": 0}

    def make(label, fail=False):
        def build():
            if fail:
                raise torch.cuda.OutOfMemoryError("no room")

            def step():
                calls[label] += 1
            return step
        return build
    def broken():
        raise RuntimeError("no kernel\nsecond line")
    res = T.time_cases({"a": make("a"), "b": make("b"), "oom": make("oom", fail=True), "bad": broken},
                       deadline=time.time() + 60, rounds=3, device="cpu", log=lambda s: None)
    assert calls == {"a": 2 + 3, "b": 2 + 3}  # two warm-up steps, one per round
    assert res["a"]["ms"] is not None and res["a"]["note"] == "3 rounds" and res["oom"]["note"] == "out of memory"
    assert res["bad"]["note"] == "failed: RuntimeError: no kernel"
    late = T.time_cases({"a": make("a")}, deadline=time.time() - 1, device="cpu", log=lambda s: None)
    assert late["a"] == dict(ms=None, peak=None, note="not run: stage budget spent")


def test_tokens_give_square_grids_and_equal_tokens_per_step():
    assert [T.side(t) for t in T.TOKENS] == [32, 64, 128]
    assert all(T.STEP_TOKENS // t * t == T.STEP_TOKENS for t in T.TOKENS)
    with pytest.raises(ValueError, match="tokens=1000: expected a square number"):
        T.side(1000)


def test_the_results_file_holds_the_machine_the_tier_and_the_ratios(tmp_path):
    tier = [dict(stage="tests/test_gpu_parity.py", rc=0, seconds=41.2, summary="122 passed in 40.1s", details=[]),
            dict(stage="tests/test_gpu_kernels.py", rc=1, seconds=80.0, summary="1 failed, 40 passed",
                 details=["FAILED tests/test_gpu_kernels.py::x - boom"])]
    vit = {1024: {"vispe none": dict(ms=10.0, peak=2**30, note="5 rounds"),
                  "vispe rope_axial": dict(ms=12.0, peak=2**30, note="5 rounds"),
                  "timm rope_axial (eva_axial)": dict(ms=15.0, peak=None, note="5 rounds"),
                  "vispe irpe": dict(ms=None, peak=None, note="out of memory")}}
    det = {"detr (dense)": dict(ms=50.0, peak=3 * 2**20, note="2 rounds")}
    out = tmp_path / "gpu_check.md"
    gpu_check.write_results(out, ["--full"], "abc1234", tier, vit, det, time.time())
    text = out.read_text()
    assert "`PYTHONPATH=. python bench/gpu_check.py --full`" in text and "- commit: abc1234" in text
    assert f"- torch: {torch.__version__}" in text and "- driver: " in text and "- device: " in text
    assert "| tests/test_gpu_kernels.py | 1 | 80 | 1 failed, 40 passed |" in text
    assert "- FAILED tests/test_gpu_kernels.py::x - boom" in text
    assert "| vispe rope_axial | 12.0 | 1.20 | 0.80 | 1024 | 5 rounds |" in text  # / vispe none, / timm's
    assert "| vispe irpe | - | - | - | - | out of memory |" in text
    assert "| detr (dense) | 50.0 | 3 | 2 rounds |" in text


def test_without_cuda_the_check_refuses_and_points_to_the_dry_run(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit):
        gpu_check.main([])
    err = capsys.readouterr().err
    assert "no CUDA GPU here" in err and "--dry-run" in err


@pytest.mark.slow
def test_main_writes_every_stage_with_the_cases_run_tiny_on_the_cpu(monkeypatch, tmp_path):
    """The GPU run's control flow with CUDA faked: every timing case of every size and every detector design
    runs (tiny, on the CPU) and lands in the results file."""
    import gpu_cases as G

    monkeypatch.setattr(gpu_check, "have_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "fake GPU")
    monkeypatch.setattr(T, "TOKENS", (4, 16))
    vit_cases, detector_step = T.vit_cases, T.detector_step
    monkeypatch.setattr(T, "vit_cases", lambda encs, tokens, device: vit_cases(encs[:2], tokens, "cpu", tiny=True))
    monkeypatch.setattr(T, "detector_step", lambda d, op, device: detector_step(d, op, "cpu", tiny=True))
    real_time = T.time_cases
    monkeypatch.setattr(T, "time_cases", lambda cases, **kw: real_time(cases, **{**kw, "device": "cpu", "rounds": 1}))
    out = tmp_path / "gpu_check.md"
    assert gpu_check.main(["--skip-tier", "--out", str(out), "--commit", "feedbee"]) == 0
    text = out.read_text()
    assert "- device: fake GPU" in text and "- commit: feedbee" in text
    assert text.count("| vispe ") == 2 * 2 and text.count("| timm ") == 2 * len(T.TIMM)  # two sizes
    assert "### 4 tokens" in text and "### 16 tokens" in text
    for op, designs in G.detector_designs().items():
        for d in designs:
            assert re.search(rf"^\| {d} \({op}\) \| \d+\.\d \| ", text, re.M), (d, op)

