"""Every GPU check of vispe in one command, sized for a lent machine's minutes (issue 54).

    PYTHONPATH=. python bench/gpu_check.py             # on one GPU: under 8 minutes on an H100
    python bench/gpu_check.py --dry-run                # any machine, CPU: builds every case tiny, says what it would run

Stages, each on its own budget (seconds; progress printed as it goes; a stage out of time is cut and
says so, the next one starts):

1. the CUDA tier, ``pytest -m gpu`` over ``tests/test_gpu_parity.py``, ``tests/test_gpu_kernels.py``,
   ``tests/test_gpu_compile_ddp.py`` and ``tests/test_gpu_towers_packed.py`` (the towers' packed path and
   Qwen2.5-VL's flex windows, issue 55) (one subprocess each, killed at its budget); torch.compile for the
   three trained encodings and one of every other family (``--full``: every encoding);
2. a ViT training step per registered encoding and timm's equivalents at 1,024, 4,096 and 16,384 tokens
   in bf16 autocast, with each step's peak memory (``bench/_gpu_timing.py``);
3. the detector designs' training step (every design of the detector's registries, ``sine``).

It writes ``results/gpu_check.md`` (``--out``) after every stage: device, driver, torch, CUDA, commit, the
command, each stage's outcome and the tables. ``--dry-run`` writes nothing: it builds every case of every stage on the
CPU at a few tokens and runs it once (the tier's cases as ``tests/gpu_cases.py`` builds them), collects
the tier with pytest, and prints the stages with their budgets; it runs in ``.ci/run``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "tests")]  # bench/_common, this checkout's vispe, the tier's cases
import _common  # noqa: E402,F401,I001  (OMP_WAIT_POLICY before torch)
import torch  # noqa: E402

import vispe  # noqa: E402

TIER = ("tests/test_gpu_parity.py", "tests/test_gpu_kernels.py", "tests/test_gpu_compile_ddp.py",
        "tests/test_gpu_towers_packed.py")
#: seconds per stage (on one H100: 8 minutes in all, with a margin for start-up and the results file)
BUDGETS = {"tests/test_gpu_parity.py": 60, "tests/test_gpu_kernels.py": 90, "tests/test_gpu_compile_ddp.py": 120,
           "tests/test_gpu_towers_packed.py": 40, "vit timing": 100, "detector timing": 40}
COMPILE = "tests/test_gpu_compile_ddp.py::test_compiled_vit_runs_three_sizes_without_recompiling"


def have_cuda() -> bool:
    return torch.cuda.is_available()


def compile_picks() -> list[str]:
    """The compile test's default run: the encodings the tier also trains compiled (``TRAINED``), and for
    every other family the registry's first encoding of it (forward only)."""
    from test_gpu_compile_ddp import TRAINED

    picks: dict[str, str] = {vispe.family_of(n): n for n in TRAINED}
    for name in vispe.available():
        picks.setdefault(vispe.family_of(name), name)
    return sorted(picks.values())


def tier_commands(full: bool) -> list[tuple[str, list[str]]]:
    """(stage, pytest arguments) of the tier, one per file."""
    out = []
    for path in TIER:
        args = [path]
        if path.endswith("compile_ddp.py") and not full:
            others = ("test_compiled_vit_trains_at_three_sizes_without_recompiling", "test_two_process_nccl_ddp_step_of_train_py")
            args = [f"{COMPILE}[{n}]" for n in compile_picks()] + [f"{path}::{t}" for t in others]
        out.append((path, ["-m", "gpu", "-q", "-rfEs", "-p", "no:cacheprovider", *args]))
    return out


def run_tier(full: bool, log) -> list[dict]:
    stages = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for path, args in tier_commands(full):
        budget, t0 = BUDGETS[path], time.time()
        log(f"== {path}: pytest -m gpu, {len(args) - 5} path(s) (budget {budget} s)")
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=budget)
            tail, rc = (proc.stdout + proc.stderr).strip().splitlines(), proc.returncode
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            tail, rc = out.strip().splitlines() + [f"cut at its budget of {budget} s"], None
        summary = tail[-1] if tail else "no output"
        log(f"   {summary} ({time.time() - t0:.0f} s)")
        stages.append(dict(stage=path, rc=rc, seconds=time.time() - t0, summary=summary,
                           details=[line for line in tail if line.startswith(("FAILED", "ERROR", "SKIPPED"))]))
    return stages


def vit_tables(results: dict) -> list[str]:
    """Markdown tables of the ViT timing, one per token count: ms per step, ratios to vispe's `none` and to
    timm's equivalent, peak memory of the step."""
    from _gpu_timing import TIMM

    lines = []
    for tokens, res in results.items():
        lines += [f"\n### {tokens:,} tokens", "", "| model | ms/step | / vispe none | / timm's | peak MiB | note |",
                  "|---|---|---|---|---|---|"]
        base = res.get("vispe none", {}).get("ms")
        for label, r in res.items():
            ms = r["ms"]
            pe = label.split()[1]
            timm_label = f"timm {pe} ({TIMM[pe]})" if pe in TIMM and label.startswith("vispe") else None
            t_ms = res.get(timm_label, {}).get("ms") if timm_label else None
            ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"  # noqa: E731
            peak = f"{r['peak'] / 2**20:.0f}" if r.get("peak") is not None else "-"
            lines.append(f"| {label} | {ms:.1f} | {ratio(ms, base)} | {ratio(ms, t_ms)} | {peak} | {r['note']} |"
                         if ms else f"| {label} | - | - | - | {peak} | {r['note']} |")
    return lines


def machine_lines(commit: str | None) -> list[str]:
    def cmd(*args):
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=20, cwd=ROOT).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    driver = cmd("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader").splitlines()
    commit = commit or cmd("git", "rev-parse", "--short", "HEAD") or "unknown (no git here: pass --commit)"
    device = torch.cuda.get_device_name(0) if have_cuda() else "no CUDA device"
    return [f"- device: {device} ({torch.cuda.device_count()} GPU(s))", f"- driver: {driver[0] if driver else 'n/a'}",
            f"- torch: {torch.__version__}, CUDA {torch.version.cuda}", f"- commit: {commit}"]


def write_results(path: Path, argv: list[str], commit, tier: list[dict], vit: dict, det: dict, started: float) -> None:
    lines = ["# GPU check (bench/gpu_check.py)", "", f"`PYTHONPATH=. python bench/gpu_check.py {' '.join(argv)}`, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {time.time() - started:.0f} s in all", "",
             *machine_lines(commit), "", "## The CUDA tier (`pytest -m gpu`)", "", "| file | exit | s | pytest's summary |",
             "|---|---|---|---|"]
    lines += [f"| {s['stage']} | {s['rc']} | {s['seconds']:.0f} | {s['summary']} |" for s in tier]
    lines += [f"- {d}" for s in tier for d in s["details"]]
    lines += ["", "## ViT training step, bf16 autocast (bench/_gpu_timing.py)", *vit_tables(vit), "",
              "## Detector designs' training step, bf16 autocast", "", "| design | ms/step | peak MiB | note |", "|---|---|---|---|"]
    mib = lambda b: "-" if b is None else f"{b / 2**20:.0f}"  # noqa: E731
    lines += [f"| {k} | {v['ms']:.1f} | {mib(v['peak'])} | {v['note']} |" if v["ms"] else f"| {k} | - | {mib(v['peak'])} | {v['note']} |"
              for k, v in det.items()]
    path.write_text("\n".join(lines) + "\n")


def dry_run(full: bool) -> int:
    """Build every case on the CPU at a few tokens and run it once; collect the tier; print the plan."""
    import gpu_cases as G
    from _gpu_timing import STEP_TOKENS, TOKENS, detector_step, vit_cases
    from gpu_kernel_cases import KERNEL_CASES, kernel_model

    t0 = time.time()
    print(f"# dry run on the CPU (torch {torch.__version__}): every case built tiny and run once")
    with torch.no_grad():
        for name in G.ENCODINGS:
            G.vit_outputs(G.vit(name), *G.vit_batch("cpu"))
        for case in G.detector_cases():
            G.detector_outputs(G.detector(*case), *G.detector_batch("cpu"))
    for case in KERNEL_CASES:
        kernel_model(case, "cpu")
    print(f"tier cases: {len(G.ENCODINGS)} ViTs, {len(G.detector_cases())} detectors "
          f"({', '.join(f'{op}: {len(ds)} designs' for op, ds in G.detector_designs().items())}), "
          f"{len(KERNEL_CASES)} kernel-report cases built ({time.time() - t0:.0f} s)")
    steps = vit_cases(G.ENCODINGS, 4, "cpu", tiny=True)  # 2 x 2 patches: one step each
    for make in steps.values():
        make()()
    print(f"vit timing: {len(steps)} models ({', '.join(steps)}) at {', '.join(f'{t:,}' for t in TOKENS)} tokens, "
          f"{STEP_TOKENS:,} patch tokens per step")
    designs = G.detector_designs()
    for op, ds in designs.items():
        for d in ds:
            detector_step(d, op, "cpu", tiny=True)()
    print(f"detector timing: {', '.join(f'{d} ({op})' for op, ds in designs.items() for d in ds)}")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    commands = tier_commands(full)
    paths = [a for _, args in commands for a in args if a.startswith("tests/")]
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                           *paths], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    ids = [line for line in proc.stdout.splitlines() if line.startswith("tests/")]
    if proc.returncode != 0 or not ids:
        print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
        return 1
    for path, args in commands:
        n = sum(i.startswith(path) for i in ids)
        print(f"would run (budget {BUDGETS[path]} s, {n} tests): pytest {' '.join(args)}")
    print(f"would run: vit timing (budget {BUDGETS['vit timing']} s), detector timing "
          f"(budget {BUDGETS['detector timing']} s); would write results/gpu_check.md")
    print(f"# dry run done in {time.time() - t0:.0f} s")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="on the CPU: build every case, say what would run")
    ap.add_argument("--full", action="store_true", help="compile every registered encoding (longer than 8 minutes)")
    ap.add_argument("--skip-tier", action="store_true", help="the timing stages alone")
    ap.add_argument("--out", default=str(ROOT / "results" / "gpu_check.md"), help="the results file")
    ap.add_argument("--commit", default=None, help="the commit, where the tree has no .git")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    if args.dry_run:
        return dry_run(args.full)
    if not have_cuda():
        ap.error(f"no CUDA GPU here (torch {torch.__version__}): run on a GPU machine, or --dry-run")
    from _gpu_timing import TOKENS, detector_step, time_cases, vit_cases
    from gpu_cases import ENCODINGS, detector_designs

    started = time.time()
    log = lambda s: print(s, flush=True)  # noqa: E731
    out = Path(args.out)
    tier: list[dict] = []
    vit: dict = {}
    det: dict = {}

    def save():  # after every stage: a run cut short (the machine's time) keeps what it measured
        write_results(out, argv, args.commit, tier, vit, det, started)
    if not args.skip_tier:
        tier = run_tier(args.full, log)
        save()
    stage_end = time.time() + BUDGETS["vit timing"]
    for i, tokens in enumerate(TOKENS):
        log(f"== vit timing, {tokens:,} tokens")
        deadline = time.time() + (stage_end - time.time()) / (len(TOKENS) - i)  # the rest shared by the sizes left
        vit[tokens] = time_cases(vit_cases(ENCODINGS, tokens, "cuda"), deadline=deadline, log=log)
        torch.cuda.empty_cache()
        save()
    log("== detector timing")
    cases = {f"{d} ({op})": (lambda d=d, op=op: detector_step(d, op, "cuda")) for op, ds in detector_designs().items() for d in ds}
    det.update(time_cases(cases, deadline=time.time() + BUDGETS["detector timing"], log=log))
    save()
    log(f"wrote {out} ({time.time() - started:.0f} s)")
    return 0 if all(s["rc"] == 0 for s in tier) else 1


if __name__ == "__main__":
    sys.exit(main())
