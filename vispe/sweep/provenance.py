"""Where and on what a result was made: git commit of the checkout, machine, time."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import vispe

#: file naming the commit of an exported snapshot (``git archive`` + this file), see git_commit
COMMIT_FILE = ".vispe-commit"


def git_commit(repo: Path | None = None) -> str:
    """``<sha>`` of the checkout vispe is imported from, ``+dirty`` when tracked files changed; "unknown"."""
    repo = repo or Path(vispe.__file__).resolve().parents[1]
    stamp = repo / COMMIT_FILE  # a snapshot of a commit (git archive) has no .git but this file
    if stamp.is_file():
        return stamp.read_text().strip()
    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown CPU")
    except OSError:
        import platform

        return platform.processor() or platform.machine()


def machine(threads: int | None = None) -> str:
    """E.g. ``AMD EPYC 7B13, 2 cores, OMP_NUM_THREADS=1`` (+ the GPU when torch sees one)."""
    import torch

    omp = threads if threads is not None else os.environ.get("OMP_NUM_THREADS", "unset")
    text = f"{cpu_model()}, {os.cpu_count()} cores, OMP_NUM_THREADS={omp}"
    if torch.cuda.is_available():
        text += f", GPU {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    return text


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")
