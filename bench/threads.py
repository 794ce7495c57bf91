"""train.py's training step with another busy process on the machine, per torch thread setting.

    python bench/threads.py [--rounds 3] [--steps 40] [--busy 1] [--config configs/default.yaml] [--spincount N]

Each setting runs in its own process (OpenMP reads its wait policy when torch loads) and times
``--steps`` training steps (forward, backward, AdamW) of the config's model on random images
of its batch size, after a warm-up; once alone and once while ``--busy`` extra processes spin
(a Python loop each, started and stopped by this script). Settings:

* before: torch's default, one thread per core, OpenMP's default wait policy (threads spin at
  barriers before sleeping), what ``train.py`` ran before ``train.threads``;
* ``train.threads=1``: one torch thread;
* after: ``train.py``'s default, ``train.threads=0`` (auto) with the ``OMP_WAIT_POLICY=PASSIVE``
  that ``train.py`` sets before torch loads: one thread per core, sleeping at barriers
  (``vispe.train.threads``).

Rounds interleave the settings (A, B, C, A, B, C...); figures are medians over rounds: wall time
per step alone and with the busy processes, and their ratio (the slowdown). "Alone" means without
this script's busy processes; other jobs on a shared machine still run (the load averages seen are
printed).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT]


def child(args) -> None:
    import torch  # before _common, which would otherwise set OMP_WAIT_POLICY for this child
    from _common import train_step

    from vispe.models.vit import create_vit
    from vispe.train.config import load_config
    from vispe.train.threads import apply_threads

    n = apply_threads(args.threads)
    cfg = load_config(args.config, [])
    m = cfg.model
    kw = {k: m[k] for k in ("embed_dim", "depth", "num_heads", "mlp_ratio") if m[k] is not None}
    torch.manual_seed(0)
    model = create_vit(m.name, pe=m.pe, img_size=32, patch_size=m.patch_size, num_classes=10, **kw)
    x, y = torch.randn(cfg.data.batch_size, 3, 32, 32), torch.randint(0, 10, (cfg.data.batch_size,))
    step = train_step(model, x, y)

    for _ in range(5):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    print(json.dumps({"s_per_step": (time.perf_counter() - t0) / args.steps, "threads": n}))


def run_setting(setting: dict, args) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(setting.get("env", {}))
    out = subprocess.run([sys.executable, __file__, "--child", "--threads", str(setting["threads"]),
                          "--steps", str(args.steps), "--config", args.config],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["s_per_step"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--busy", type=int, default=1, help="extra spinning processes in the loaded runs")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "default.yaml"))
    ap.add_argument("--spincount", type=int, default=None,
                    help="add a setting: one thread per core with GNU OpenMP's GOMP_SPINCOUNT=N")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    from _common import load, machine

    cores = len(os.sched_getaffinity(0))
    settings = {f"before: torch's default ({cores} threads, spinning)": {"threads": cores},
                "train.threads=1": {"threads": 1},
                f"after: train.py's default (auto = {cores} threads, passive)": {
                    "threads": 0, "env": {"OMP_WAIT_POLICY": "PASSIVE"}}}
    if args.spincount is not None:
        settings[f"{cores} threads, GOMP_SPINCOUNT={args.spincount} (spin briefly, then sleep)"] = {
            "threads": cores, "env": {"GOMP_SPINCOUNT": str(args.spincount)}}
    times = {(n, busy): [] for n in settings for busy in (False, True)}
    loads = []
    for _ in range(args.rounds):
        for busy in (False, True):
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy if busy else 0)]
            try:
                time.sleep(0.5 if busy else 0)
                for name, s in settings.items():
                    times[(name, busy)].append(run_setting(s, args))
                loads.append(load())
            finally:
                for p in spinners:
                    p.kill()
                    p.wait()
    print(f"# train step of {os.path.relpath(args.config, ROOT)}'s model, alone and with {args.busy} busy "
          f"process(es); {args.rounds} interleaved rounds x {args.steps} steps")
    print(f"# {machine()}; load averages seen: {'; '.join(loads)}")
    print("| setting | ms/step alone | ms/step with busy | slowdown |")
    print("|---|---|---|---|")
    for name in settings:
        a, b = times[(name, False)], times[(name, True)]
        slow = statistics.median(y / x for x, y in zip(a, b))
        print(f"| {name} | {1e3 * statistics.median(a):.1f} | {1e3 * statistics.median(b):.1f} | x{slow:.2f} |")


if __name__ == "__main__":
    main()
