"""Shared helpers of the bench scripts: interleaved timing, medians of ratios, machine line.

Imported before torch by every script: OpenMP threads then sleep at barriers instead of spinning
(``OMP_WAIT_POLICY=PASSIVE``, as ``train.py``), so that other jobs on a shared machine do not
stall the timed code several-fold (``bench/threads.py``). An explicit setting wins.
"""
from __future__ import annotations

import contextlib
import os
import random
import statistics
import sys
import time

if "torch" not in __import__("sys").modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402


def machine() -> str:
    """CPU model (or GPU name), cores, torch threads, torch version, load average."""
    from vispe.train.runner import machine as device_words  # the words of train.py's summaries

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return f"{device_words(device)}; torch {torch.__version__}; load average {load()}"


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def timed(fn, iters: int = 1, sync=None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) per call of ``fn`` (``iters`` calls).

    CPU time counts what the process's threads computed, not the time other jobs held the cores,
    so on a shared machine its ratios are the steadier ones (threads waiting at an OpenMP barrier
    sleep under ``OMP_WAIT_POLICY=PASSIVE`` and are not counted). On a GPU only wall time means
    anything."""
    if sync:
        sync()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(iters):
        fn()
    if sync:
        sync()
    return (time.perf_counter() - w0) / iters, (time.process_time() - c0) / iters


def interleaved(fns: dict, rounds: int, iters: int = 1, warmup: int = 1, sync=None, seed: int = 0) -> dict:
    """{name: [(wall, cpu) seconds per round]}: every function once per round, round after round,
    in a new random order each round (seeded), so that no function always follows the same one."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {n: [] for n in fns}
    order, rng = list(fns), random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for n in order:
            times[n].append(timed(fns[n], iters, sync))
    return times


def train_step(model, x, y, *, bf16_autocast: bool = False):
    """One training step of ``model`` on ``(x, y)`` as a closure: forward, cross-entropy, backward and
    an AdamW update (lr 1e-4), under bf16 autocast on ``x``'s device when asked."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16_autocast):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def cpu_alloc_peak(fn) -> int:
    """Highest sum of allocations minus frees by torch's CPU allocator during ``fn()`` (the profiler's
    memory events in order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return peak


def positive_args(ap, args, *names: str) -> None:
    """Stop through ``ap.error`` unless every option ``--name`` of ``args`` is a positive integer."""
    for name in names:
        if getattr(args, name) < 1:
            ap.error(f"--{name}={getattr(args, name)}: expected a positive integer")


CLOCKS = {"wall": 0, "cpu": 1}


def ratio(times: dict, name: str, base: str, clock: str = "wall") -> float:
    """Median over rounds of ``name``'s time divided by ``base``'s time in the same round."""
    i = CLOCKS[clock]
    return statistics.median(a[i] / b[i] for a, b in zip(times[name], times[base]))


def spread(times: dict, name: str, base: str, clock: str = "wall") -> tuple[float, float]:
    """Lower and upper quartile over rounds of the same per-round ratios as ``ratio``: how much one
    round varies from the next (the median of many rounds is steadier than that)."""
    i = CLOCKS[clock]
    r = [a[i] / b[i] for a, b in zip(times[name], times[base])]
    if not r:
        raise ValueError(f"no rounds timed for {name!r}: expected rounds >= 1")
    if len(r) < 2:
        return r[0], r[0]
    q = statistics.quantiles(r, n=4, method="inclusive")
    return q[0], q[2]


def ms(times: dict, name: str, clock: str = "wall") -> float:
    return 1e3 * statistics.median(t[CLOCKS[clock]] for t in times[name])


#: op groups of ``compare_ops``: where a step's time goes, by kind of work
GROUPS = {"matrix products": ("aten::mm", "aten::addmm", "aten::bmm"),
          "convolutions": ("aten::mkldnn_convolution", "aten::convolution_backward", "aten::_slow_conv2d_forward",
                           "aten::_slow_conv2d_backward"),
          "attention kernels": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                                "aten::_scaled_dot_product_flash_attention_for_cpu_backward")}


def compare_ops(fns: dict, title: str, steps: int = 2, rows: int = 25) -> None:
    """Self CPU time per op and call of two step functions ``{label: fn}`` (torch.profiler, after one
    warm-up call each): the ops that differ most, then the time by kind of work (``GROUPS``)."""
    from torch.profiler import ProfilerActivity, profile

    res = {}
    for who, fn in fns.items():
        fn()
        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                fn()
        res[who] = {e.key: (e.self_cpu_time_total / 1000 / steps, e.count // steps) for e in prof.key_averages()}
    (la, h), (lb, v) = res.items()
    keys = sorted(set(h) | set(v), key=lambda k: -abs(v.get(k, (0, 0))[0] - h.get(k, (0, 0))[0]))
    print(f"\n## {title}: self CPU ms per step by op ({steps} profiled steps each), the {rows} that differ most")
    print(f"{'op':<58}{la + ' ms':>16}{'calls':>7}{lb + ' ms':>14}{'calls':>7}")
    for k in keys[:rows]:
        (a, n), (b, m) = h.get(k, (0.0, 0)), v.get(k, (0.0, 0))
        print(f"{k[:57]:<58}{a:>16.1f}{n:>7d}{b:>14.1f}{m:>7d}")
    print(f"\n{'kind of work':<26}{la + ' ms':>16}{lb + ' ms':>14}")
    grouped = set()
    for group, ops in GROUPS.items():
        grouped |= set(ops)
        print(f"{group:<26}{sum(h.get(o, (0, 0))[0] for o in ops):>16.1f}{sum(v.get(o, (0, 0))[0] for o in ops):>14.1f}")
    print(f"{'everything else':<26}{sum(t for k, (t, _) in h.items() if k not in grouped):>16.1f}"
          f"{sum(t for k, (t, _) in v.items() if k not in grouped):>14.1f}")
    print(f"{'total':<26}{sum(t for t, _ in h.values()):>16.1f}{sum(t for t, _ in v.values()):>14.1f}")


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ side prints start/stop lines on stderr: silenced while it records."""
    fd, saved = sys.stderr.fileno(), os.dup(sys.stderr.fileno())
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)
