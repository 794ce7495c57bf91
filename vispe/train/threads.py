"""How many CPU threads torch uses in a training process (``train.threads``).

torch's default is one OpenMP thread per core, and OpenMP threads spin at every barrier before
they sleep. A small model runs thousands of short parallel regions per step, so when another
process takes one of the cores, the thread left waiting for it spins through its time slice at
every barrier and the run slows down several-fold (measured: ``bench/threads.py``,
``results/bench_threads.md``). ``train.threads``:

* ``0`` (default, "auto"): one thread per usable core (``os.sched_getaffinity``) when
  ``OMP_WAIT_POLICY`` is ``PASSIVE`` (``train.py`` sets it unless the environment says otherwise,
  so waiting threads sleep instead of spinning), else one thread;
* ``n > 0``: exactly n threads;

``OMP_NUM_THREADS`` in the environment, when set, wins over "auto" (torchrun sets it to 1 per process).
"""
from __future__ import annotations

import os

import torch


def auto_threads() -> int:
    """The thread count that ``train.threads=0`` stands for (module docstring)."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def apply_threads(threads: int) -> int:
    """Set torch's intra-op threads from ``train.threads`` (0 = auto); returns the count used."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"train.threads={threads!r}: expected 0 (auto) or a positive number of threads")
    n = threads or auto_threads()
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
