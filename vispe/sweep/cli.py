"""Sweep: expand a grid of encodings x seeds (x --vary values) into ordinary train.py runs.

    python -m vispe.sweep --config configs/digits_cell.yaml --pe none,sine,learned_abs --seeds 0,1,2
    python -m vispe.sweep --config configs/digits_cell.yaml --pe peg --seeds 0,1,2 \\
        --vary model.pe_kwargs.padding_mode=zeros,none train.epochs=5
    python -m vispe.sweep ... --launcher slurm --partition gpu --gpus-per-node 1 --timeout-min 240
    python -m vispe.report runs/sweeps/digits_cell          # tables and plots of what has finished

Each grid point is one run folder ``<out>/<encoding>[+key-value]_seed<k>/`` made by
``python train.py --config CFG --resume <overrides>``: a finished point is skipped, an interrupted
one resumes from its checkpoint, so running the same command again continues a sweep. After each
point the tidy table ``<out>/results.csv`` is rewritten (vispe.sweep.collect); ``<out>/sweep.json``
records every invocation (command, git commit, machine, start and end).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vispe.sweep import collect as K, grid as G, launch as L, provenance as P


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m vispe.sweep", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--config", required=True, help="train.py config (YAML)")
    p.add_argument("--pe", required=True, help="comma-separated encodings, e.g. none,sine,learned_abs")
    p.add_argument("--seeds", default="0", help="comma-separated train.seed values (default 0)")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                   help="another grid axis over a config key (repeatable)")
    p.add_argument("--out", default=None, help="sweep folder (default runs/sweeps/<config name>)")
    p.add_argument("--launcher", default="local", choices=L.LAUNCHERS,
                   help="local: one run after another here; slurm: submitit jobs on a Slurm cluster; "
                        "submitit-local: submitit's local executor (tests the cluster path without one)")
    p.add_argument("--threads", type=int, default=None, help="OMP/MKL threads per run (default: inherited)")
    p.add_argument("--dry-run", action="store_true", help="print the points and their state; run nothing")
    p.add_argument("--no-wait", action="store_true", help="submitit: submit and return without waiting")
    g = p.add_argument_group("submitit / Slurm")
    g.add_argument("--partition", default=None)
    g.add_argument("--account", default=None)
    g.add_argument("--qos", default=None)
    g.add_argument("--constraint", default=None)
    g.add_argument("--gpus-per-node", type=int, default=None)
    g.add_argument("--cpus-per-task", type=int, default=None)
    g.add_argument("--mem-gb", type=float, default=None)
    g.add_argument("--timeout-min", type=int, default=60, help="time limit per job in minutes (default 60)")
    g.add_argument("--array-parallelism", type=int, default=None, help="most jobs of the array running at once")
    g.add_argument("--job-name", default=None)
    p.add_argument("overrides", nargs="*", help="section.key=value for every point, e.g. train.epochs=3")
    return p.parse_intermixed_args(argv)


def plan(args) -> tuple[Path, Path, list, list[str]]:
    """Check everything before any run starts: (config, sweep folder, points, overrides)."""
    import vispe
    from vispe.train import config as C

    config = Path(args.config).resolve()
    if not config.is_file():
        raise ValueError(f"--config {args.config!r}: no such file")
    pes = G.split_list(args.pe, "--pe")
    unknown = [pe for pe in pes if pe not in vispe.available()]
    if unknown:
        from vispe.registry import suggest

        hints = "".join(f" ({pe!r}: did you mean {', '.join(suggest(pe))}?)" for pe in unknown if suggest(pe))
        raise ValueError(f"--pe: unknown encoding(s) {', '.join(unknown)}{hints}; expected names from "
                         f"{', '.join(vispe.available())}")
    G.check_overrides(args.overrides)
    points = G.expand(pes, G.parse_seeds(args.seeds), G.parse_vary(args.vary))
    out = Path(args.out or Path("runs") / "sweeps" / config.stem).resolve()
    for pt in points:  # a misspelt key or a wrong type fails here, for the whole sweep
        C.load_config(config, [*args.overrides, *pt.overrides(out)])
    return config, out, points, list(args.overrides)


def point_state(folder: Path, epochs: int) -> str:
    from vispe.train import rundir

    st = rundir.state(folder)
    if st == "finished":
        top = K._read_json(folder / "summary.json") or {}
        if all(e.get("epochs", 0) >= epochs for e in top.get("encodings", {}).values()):
            return "finished"
        return "unfinished"  # asked for more epochs than it ran: train.py --resume continues it
    return st


def _write_point(folder: Path, pt, config: Path, overrides: list[str], commit: str, **extra) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    old = K._read_json(folder / K.POINT_FILE) or {}
    rec = {**old, "pe": pt.pe, "seed": pt.seed, "vary": dict(pt.vary), "overrides": overrides,
           "config": str(config), "commit": commit, **extra}
    (folder / K.POINT_FILE).write_text(json.dumps(rec, indent=2) + "\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config, out, points, overrides = plan(args)
    except ValueError as e:
        print(f"vispe.sweep: error: {e}", file=sys.stderr)
        return 2
    from vispe.train import config as C

    epochs = C.load_config(config, overrides).train.epochs
    active = L.active_jobs(out, args.launcher) if out.is_dir() else set()
    states = {pt.name: ("running (job)" if pt.name in active else point_state(out / pt.name, epochs)) for pt in points}
    todo = [pt for pt in points if states[pt.name] not in ("finished", "running (job)")]
    print(f"sweep {out}: {len(points)} points, {len(points) - len(todo)} finished or running, {len(todo)} to run",
          flush=True)
    if args.dry_run:
        for pt in points:
            print(f"  {pt.name:40s} {states[pt.name]}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    commit = P.git_commit()
    command = "python -m vispe.sweep " + " ".join(sys.argv[1:] if argv is None else argv)
    record = {"command": command.strip(), "config": str(config), "commit": commit, "machine": P.machine(args.threads),
              "launcher": args.launcher, "points": [pt.name for pt in points], "to_run": [pt.name for pt in todo],
              "started": P.now()}
    log = _append_invocation(out, record)
    jobs = []
    for pt in todo:
        _write_point(out / pt.name, pt, config, overrides, commit, command=command.strip())
        jobs.append((pt.name, L.train_argv(config, [*overrides, *pt.overrides(out)]), out / pt.name))
    env = {k: str(args.threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")} if args.threads else {}
    by_name = {pt.name: pt for pt in points}

    def on_done(name: str, res: dict) -> None:
        _write_point(out / name, by_name[name], config, overrides, commit, last_rc=res.get("rc"),
                     last_wall_s=res.get("wall_s"), command=command.strip())
        K.collect(out)

    if args.launcher == "local":
        results = L.run_local(jobs, env, on_done)
    else:
        opts = {k: getattr(args, k) for k in ("partition", "account", "qos", "constraint", "gpus_per_node",
                                               "cpus_per_task", "mem_gb", "timeout_min", "array_parallelism", "job_name")}
        results = L.run_submitit(jobs, env, args.launcher, out, opts, wait=not args.no_wait, on_done=on_done)
    df = K.collect(out)
    stopped = sorted(n for n, r in results.items() if r.get("rc") == L.STOPPED)
    failed = sorted(n for n, r in results.items() if r.get("rc") not in (0, L.STOPPED))
    record.update({"ended": P.now(), "failed": failed, "stopped": stopped,
                   "wall_s": {n: r.get("wall_s") for n, r in results.items()}})
    _append_invocation(out, record, replace=log)
    finished = set(df[df["status"] == "finished"]["run"]) if len(df) else set()
    done = sum(pt.name in finished for pt in points)
    print(f"sweep {out}: {done} of {len(points)} points finished; table {out / K.RESULTS_FILE}", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)} (see each folder's train.log; rerun the command to resume)", file=sys.stderr)
    if stopped:
        print(f"stopped: {', '.join(stopped)}; rerun the command to resume", file=sys.stderr)
        return L.STOPPED
    return 1 if failed else 0


def _append_invocation(out: Path, record: dict, replace: int | None = None) -> int:
    """Add (or replace entry ``replace`` of) the invocation list in ``<out>/sweep.json``; its index."""
    f = out / "sweep.json"
    data = K._read_json(f) or {"invocations": []}
    if replace is None:
        data["invocations"].append(record)
        replace = len(data["invocations"]) - 1
    else:
        data["invocations"][replace] = record
    tmp = f.with_name(f.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(f)
    return replace
