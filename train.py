"""Train a ViT with a chosen 2D positional encoding and compare it with baselines.

    python train.py                                            # embedded default (configs/default.yaml)
    python train.py --config configs/cifar10_vit.yaml model.pe=rope_mixed train.epochs=100
    python train.py --config configs/cifar10_vit.yaml --smoke  # the config's tiny variant
    python train.py --config runs/default/config.yaml --resume # continue a run after a stop or crash
    torchrun --nproc_per_node 4 train.py --config configs/cifar10_vit.yaml

``python`` is the project environment's (docs/install.md: activate .venv, or write python3 bootstrap.py).
Each override is ``section.key=value`` (see vispe/train/config.py for every key); a misspelt key
or a wrong type is refused. The run folder ``runs/<train.run_name>/`` receives the resolved config,
and one sub-folder per encoding (``model.pe`` then ``train.compare``) with its checkpoint,
metrics.csv, TensorBoard events (tb/), curves.png and summary.json; the comparison table of the
final test metric at every evaluation size is printed and written to comparison.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

# OpenMP threads sleep at once at a barrier instead of spinning, so that a core taken by another
# process does not stall every step (read when torch loads, hence before the imports below;
# vispe/train/threads.py and bench/threads.py). An explicit setting in the environment wins.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from vispe.data.common import DataFileError  # noqa: E402
from vispe.train import (
    config as C,  # noqa: E402
    distributed as D,
    rundir,
)
from vispe.train.checkpoint import CheckpointError
from vispe.train.engine import Interrupted, resolve_amp, resolve_device
from vispe.train.logging import WriteError, atomic_write, comparison_table, plot_comparison
from vispe.train.runner import SetupError, build_data, build_model, run_encoding
from vispe.train.tasks import get_task

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "default.yaml"
#: how to continue a stopped run, as the documentation writes it (docs/guides/train.md) (its stored config: any overrides included)
RESUME_HINT = "python train.py --config {config} --resume"
USER_ERRORS = (C.ConfigError, CheckpointError, rundir.RunFolderError, SetupError)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--config", default=None, help="YAML config (default: configs/default.yaml)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in <train.out_dir>/<train.run_name> (a new run if there is none)")
    p.add_argument("--smoke", action="store_true", help="apply the config's `smoke` overrides (a tiny run)")
    p.add_argument("overrides", nargs="*", help="section.key=value, e.g. model.pe=rope_mixed train.epochs=3")
    return p.parse_intermixed_args(argv)  # flags and overrides in any order


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.time()
    dist = D.DistInfo()
    try:
        cfg = C.load_config(args.config or DEFAULT_CONFIG, args.overrides, smoke=args.smoke)
        try:
            device = resolve_device(cfg.train.device)
            resolve_amp(cfg.train.amp, device)
        except ValueError as e:
            raise C.ConfigError(str(e)) from None
        dist = D.setup(device.type)
        task = get_task(cfg.task)
        data = build_data(task, cfg)
        pes = C.encodings(cfg)
        for pe in pes:  # an unknown encoding or a bad model option fails here, before anything is written
            build_model(task, C.for_encoding(cfg, pe), data)
        action, notes = rundir.plan(cfg, resume=args.resume, smoke=args.smoke)
        D.barrier()
        out = rundir.run_dir(cfg)
        if dist.is_main:
            for note in notes:
                print(note, flush=True)
            rundir.execute(cfg, action, smoke=args.smoke)
            print(f"run folder: {out}  (encodings: {', '.join(pes)}; world size {dist.world_size})", flush=True)
        D.barrier()
        summaries, histories, trained = {}, {}, False
        for pe in pes:
            sub_cfg, sub = C.for_encoding(cfg, pe), rundir.encoding_dir(out, pe)
            done = rundir.finished_summary(sub, cfg.train.epochs) if action == "resume" else None
            if done is None:
                if dist.is_main:
                    rundir.write_config(sub, sub_cfg)
                done = run_encoding(sub_cfg, task, data, sub, resume=action == "resume", dist=dist)
                trained = True
            elif dist.is_main:
                print(f"[{pe}] already finished in {sub}: not trained again", flush=True)
            summaries[pe] = done
            histories[pe] = _history(sub)
            if dist.is_main:
                print(final_line(done), flush=True)
        if dist.is_main:
            if trained or rundir.state(out) != "finished":
                report(cfg, out, summaries, histories, time.time() - t_start, argv)
            else:  # nothing new: keep the finished run's files as they are
                print("\n" + comparison_table(summaries, next(iter(summaries.values()))["primary"]), flush=True)
        return 0
    except USER_ERRORS as e:
        print(f"train.py: error: {e}", file=sys.stderr, flush=True)
        if os.environ.get("VISPE_TRACEBACK"):
            traceback.print_exc()
        return 2
    except WriteError as e:  # full disk, read-only folder: the last checkpoint and the logs stay as they are
        print(f"train.py: error: {e}", file=sys.stderr, flush=True)
        return 1
    except (FloatingPointError, DataFileError) as e:  # diverged, or a bad data file: checkpoints and logs stay
        print(f"train.py: error: {e}", file=sys.stderr, flush=True)
        if isinstance(e, DataFileError):
            print("train.py: the checkpoints and logs written so far are kept; fix or remove the file, then "
                  "continue with --resume", file=sys.stderr, flush=True)
        return 1
    except Interrupted:
        if dist.is_main:
            stored = rundir.run_dir(cfg) / "config.yaml"
            print(f"stopped: checkpoint saved. Continue with: {RESUME_HINT.format(config=stored)}",
                  file=sys.stderr, flush=True)
        return 130
    finally:
        D.cleanup()


def final_line(summary: dict) -> str:
    m = summary["primary"]
    sizes = "  ".join(f"{m}@{s}px {r[m]:.4f}" for s, r in summary["eval"].items())
    return (f"[{summary['encoding']}] final: {sizes}  (train {summary['train_time_s']:.0f}s, "
            f"{summary['steps']} steps, {summary['device']})")


def report(cfg, out: Path, summaries: dict, histories: dict, runtime: float, argv) -> None:
    """Print and save the comparison of the encodings; mark the run folder finished."""
    metric = next(iter(summaries.values()))["primary"]
    table = comparison_table(summaries, metric)
    command = "python train.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = (f"# {cfg.train.run_name}: {cfg.task.name} on {cfg.data.name}\n\n{table}\n\n"
            f"Command: `{command.strip()}`  \nTotal runtime: {runtime:.0f} s on "
            f"{next(iter(summaries.values()))['device']}\n")
    atomic_write(out / "comparison.md", text)
    plot_comparison(histories, out / "comparison.png", metric=f"test_{metric}")
    summary = {"finished": True, "run_name": cfg.train.run_name, "command": command.strip(),
               "runtime_s": round(runtime, 1), "primary": metric, "encodings": summaries}
    atomic_write(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    print("\n" + table + f"\n\ntotal runtime {runtime:.0f} s; results in {out}", flush=True)


def _history(sub: Path) -> list[dict]:
    import csv

    f = sub / "metrics.csv"
    if not f.is_file():
        return []
    with open(f) as fh:
        return [{k: (float(v) if k != "epoch" else int(v)) for k, v in row.items() if v != ""}  # "": not evaluated
                for row in csv.DictReader(fh)]


if __name__ == "__main__":
    sys.exit(main())
