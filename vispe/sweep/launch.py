"""Running the points of a sweep: one after another here, or as submitit jobs (Slurm or local).

Every point is the same command, ``python train.py --config CFG --resume <overrides> <point
overrides>``, run in a fresh process (so its peak memory is its own) with its output appended to
``<run folder>/train.log``. ``--resume`` makes one command serve for a first start and every restart:
train.py starts an empty folder, continues an interrupted one from its checkpoint and leaves a
finished one as it is.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import vispe
from vispe.sweep.trace import traced

LAUNCHERS = ("local", "submitit-local", "slurm")
STOPPED = 130  # train.py's exit status after Ctrl-C / SIGTERM (checkpoint saved)


def train_script() -> Path:
    """The repository's train.py (next to the ``vispe`` package of an editable install)."""
    path = Path(vispe.__file__).resolve().parents[1] / "train.py"
    if not path.is_file():
        raise FileNotFoundError(f"train.py not found at {path}: the sweep runs the repository's train.py, so "
                                "use vispe from a checkout (pip install -e .)")
    return path


def train_argv(config: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, str(train_script()), "--config", str(config), "--resume", *overrides]


def run_point(argv: list[str], log_path: str, env: dict | None = None) -> dict:
    """Run one train.py command, output appended to ``log_path``; ``{"rc", "wall_s"}``.

    Ctrl-C or SIGTERM to the sweep reaches the run (Ctrl-C through the terminal's process group,
    SIGTERM forwarded here), which saves a checkpoint after its current step and exits with 130;
    the sweep waits for that (a second Ctrl-C kills the run at once). A module-level function so
    that submitit can pickle it for a job.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    # train.py through the tracing wrapper: the run folder gets imports.json, the files it used (trace.py)
    run, trace_env = traced(argv, log_path.parent) if Path(argv[1]).name == "train.py" else (argv, {})
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(run, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {}), **trace_env},
                                cwd=str(train_script().parent))
        forward = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM)) if forward else None
        try:
            rc = _wait(proc)
        finally:
            if forward:
                signal.signal(signal.SIGTERM, old)
    return {"rc": rc, "wall_s": round(time.time() - t0, 1)}


def _wait(proc: subprocess.Popen) -> int:
    try:
        return proc.wait()
    except KeyboardInterrupt:  # the run got the Ctrl-C too: let it save its checkpoint
        print("\nwaiting for the run to save its checkpoint (Ctrl-C again to kill it)", flush=True)
        try:
            proc.wait()
        except KeyboardInterrupt:
            proc.kill()
        raise


def run_local(jobs: list[tuple[str, list[str], Path]], env: dict, on_done) -> dict:
    """Run ``jobs`` = [(name, argv, run folder)] one after another; ``on_done(name, result)`` after each."""
    results = {}
    for i, (name, argv, folder) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {name} ...", flush=True)
        res = run_point(argv, str(folder / "train.log"), env)
        results[name] = res
        status = "done" if res["rc"] == 0 else f"FAILED (exit {res['rc']}; see {folder / 'train.log'})"
        if res["rc"] == STOPPED:
            status = "stopped (checkpoint saved; run the same command again to resume)"
        print(f"[{i}/{len(jobs)}] {name} {status} in {res['wall_s']:.0f}s", flush=True)
        on_done(name, res)
        if res["rc"] == STOPPED:  # Ctrl-C / SIGTERM: the whole sweep stops here
            break
    return results


def make_executor(launcher: str, folder: Path, opts: dict):
    """A submitit executor: ``slurm`` (partition, GPUs, time...) or ``submitit-local`` (subprocesses here)."""
    import submitit

    ex = submitit.AutoExecutor(folder=str(folder), cluster="slurm" if launcher == "slurm" else "local")
    params = {"timeout_min": int(opts.get("timeout_min") or 60), "name": opts.get("job_name") or "vispe-sweep"}
    for key in ("gpus_per_node", "cpus_per_task", "mem_gb"):
        if opts.get(key) is not None:
            params[key] = opts[key]
    if launcher == "slurm":
        for key in ("partition", "account", "qos", "constraint"):
            if opts.get(key):
                params[f"slurm_{key}"] = opts[key]
        if opts.get("array_parallelism"):
            params["slurm_array_parallelism"] = int(opts["array_parallelism"])
    ex.update_parameters(**params)
    return ex


def run_submitit(jobs: list[tuple[str, list[str], Path]], env: dict, launcher: str, sweep_dir: Path,
                 opts: dict, *, wait: bool, on_done) -> dict:
    """Submit one job per point (a job array on Slurm); wait for them unless ``wait`` is False.

    The job ids go to ``<sweep_dir>/jobs.json``, so that a later invocation can leave points whose job
    is still queued or running alone (``active_jobs``).
    """
    ex = make_executor(launcher, sweep_dir / "submitit", opts)
    with ex.batch():
        submitted = [(name, ex.submit(run_point, argv, str(folder / "train.log"), env)) for name, argv, folder in jobs]
    record = _read_jobs(sweep_dir)
    record.update({name: {"job_id": str(job.job_id), "launcher": launcher} for name, job in submitted})
    (sweep_dir / "jobs.json").write_text(json.dumps(record, indent=2) + "\n")
    for name, job in submitted:
        print(f"submitted {name}: job {job.job_id}", flush=True)
    results = {}
    if not wait:
        print(f"not waiting (--no-wait): run the same command again later to collect results and resume "
              f"what did not finish; logs in {sweep_dir / 'submitit'}", flush=True)
        return results
    for name, job in submitted:
        try:
            results[name] = job.result()
        except Exception as e:  # the job itself failed (time limit, node failure): the point stays unfinished
            results[name] = {"rc": -1, "error": f"{type(e).__name__}: {e}"}
        on_done(name, results[name])
    return results


def _read_jobs(sweep_dir: Path) -> dict:
    f = sweep_dir / "jobs.json"
    try:
        return json.loads(f.read_text()) if f.is_file() else {}
    except ValueError:
        return {}


def active_jobs(sweep_dir: Path, launcher: str) -> set[str]:
    """Names of points whose recorded submitit job is still pending or running (Slurm only)."""
    if launcher != "slurm":
        return set()
    import submitit

    active = set()
    for name, rec in _read_jobs(sweep_dir).items():
        if rec.get("launcher") != "slurm":
            continue
        state = submitit.SlurmJob(folder=str(sweep_dir / "submitit"), job_id=rec["job_id"]).state
        if state.upper() in ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED"):
            active.add(name)
    return active
