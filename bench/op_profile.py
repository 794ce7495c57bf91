"""Where a training step's time goes, operator by operator, for two ViTs side by side.

    python bench/op_profile.py vispe:none vispe:rope_axial [--steps 4] [--rows 25]
    python bench/op_profile.py timm:vit_relpos vispe:relbias

Each model is the CIFAR-sized ViT of ``bench/vit_vs_timm.py`` (``vispe:<encoding>`` built by
``vispe_model``, ``timm:<name>`` one of that script's timm equivalents). After warm-up steps, ``--steps``
training steps (forward + backward + AdamW) of each model run under ``torch.profiler``; the table
lists the operators whose self CPU time per step differs most between the two, with their calls
per step. "Self CPU time" is the profiler's: the time the calling thread spent inside each
operator (not the sum over OpenMP threads), close to its wall time. It moves by up to about 50%
between runs for the same operator (compare the rows of operators both models share): read the
rows an encoding adds, not the totals.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # this checkout's vispe, then bench/_common
import torch  # noqa: E402
from _common import machine, positive_args, train_step  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from vit_vs_timm import COMMON, timm_model, vispe_model  # noqa: E402


def build(spec: str) -> torch.nn.Module:
    kind, _, name = spec.partition(":")
    if kind == "vispe" and name:
        return vispe_model(name)
    if kind == "timm" and name:
        try:
            return timm_model(name)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    raise SystemExit(f"model {spec!r}: expected vispe:<encoding> (a name of vispe.registry) or "
                     "timm:<name> (vit_none, vit_learn, eva_axial, eva_mixed, vit_relpos)")


def op_times(model: torch.nn.Module, steps: int, batch: int) -> dict:
    """{operator: (self CPU ms per step, calls per step)} over ``steps`` training steps."""
    torch.manual_seed(0)
    x = torch.randn(batch, 3, COMMON["img_size"], COMMON["img_size"])
    y = torch.randint(0, COMMON["num_classes"], (batch,))
    step = train_step(model.train(), x, y)
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return {e.key: (e.self_cpu_time_total / 1e3 / steps, e.count // steps) for e in prof.key_averages()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="vispe:<encoding> or timm:<name>")
    ap.add_argument("b", help="vispe:<encoding> or timm:<name>")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rows", type=int, default=25)
    args = ap.parse_args(argv)
    positive_args(ap, args, "steps", "batch", "rows")
    models = {spec: build(spec) for spec in (args.a, args.b)}  # both specs checked before any profiling
    times = {spec: op_times(m, args.steps, args.batch) for spec, m in models.items()}
    ta, tb = times[args.a], times[args.b]
    zero = (0.0, 0)
    keys = sorted(set(ta) | set(tb), key=lambda k: -abs(tb.get(k, zero)[0] - ta.get(k, zero)[0]))
    print(f"# self CPU time per training step (ms) and calls per step; batch {args.batch}, {args.steps} profiled steps")
    print(f"# {machine()}")
    print(f"| operator | {args.a} ms | calls | {args.b} ms | calls | difference ms |")
    print("|---|---|---|---|---|---|")
    for k in keys[:args.rows]:
        (a, na), (b, nb) = ta.get(k, zero), tb.get(k, zero)
        print(f"| {k[:60]} | {a:.1f} | {na} | {b:.1f} | {nb} | {b - a:+.1f} |")
    print(f"| total | {sum(v[0] for v in ta.values()):.1f} | | {sum(v[0] for v in tb.values()):.1f} | | |")


if __name__ == "__main__":
    main()
