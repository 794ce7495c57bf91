"""Resume is exact on CPU: a run killed with SIGKILL mid-epoch, or stopped by Ctrl-C, and resumed
ends with the same metrics, logs and weights as the same run left alone.

Data: the miniature CIFAR-10 through the real loader, whose random crop and flip make the test
also cover the random state of data augmentation; drop-path covers the model's random state.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import load_train_main
from vispe.data.miniature import write_miniature_cifar10

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("epoch_time_s", "img_per_s")



@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    write_miniature_cifar10(tmp / "data", n_per_batch=20, seed=0)  # 100 train, 20 test images
    args = ["--config", str(ROOT / "configs/cifar10_vit.yaml"), "--smoke", f"data.root={tmp / 'data'}",
            "data.kwargs.verify_md5=false", f"train.out_dir={tmp / 'runs'}", "train.progress=false",
            "data.batch_size=16", "train.epochs=2", "train.ckpt_every_steps=3", "model.drop_path_rate=0.1",
            "model.embed_dim=32", "model.num_heads=2", "model.depth=2", "train.eval_sizes=[1.0,1.5]",
            "optim.warmup_epochs=0.5", "train.log_every=1"]
    main = load_train_main()
    assert main(args + ["train.run_name=straight"]) == 0  # 7 steps per epoch, 14 in all
    return tmp, args, main


def _results(run: Path):
    summary = json.loads((run / "learned_abs" / "summary.json").read_text())
    with open(run / "learned_abs" / "metrics.csv") as f:
        rows = [{k: v for k, v in r.items() if k not in TIMING} for r in csv.DictReader(f)]
    final = {k: v for k, v in summary["final"].items() if k not in TIMING}
    weights = torch.load(run / "learned_abs" / "checkpoint.pt", weights_only=True)["model"]
    return final, summary["eval"], rows, weights


def _scalars(tb: Path) -> dict:
    """Every TensorBoard scalar in folder ``tb`` in the order TensorBoard reads them back (after its
    purge of orphaned steps): {tag: [(step, wall_time, value), ...]} (timings left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
            if not tag.endswith(TIMING)}


def _tensorboard(run: Path) -> dict:
    """{tag: [(step, value), ...]} sorted by step, then wall time (independent of the files' order,
    which test_a_resumed_run_s_events_read_back_after_the_stopped_run_s checks on its own)."""
    return {tag: [(s, v) for s, _, v in sorted(rows)] for tag, rows in _scalars(run / "learned_abs" / "tb").items()}


def _assert_same_tensorboard(straight: Path, resumed: Path):
    a, b = _tensorboard(straight), _tensorboard(resumed)
    assert "epoch/test_acc" in a and len(a["train/loss"]) == 14
    assert a.keys() == b.keys()
    for tag in a:
        assert a[tag] == b[tag], f"TensorBoard {tag}: uninterrupted {a[tag]} vs resumed {b[tag]}"


def _assert_same(a, b):
    assert a[0] == b[0], "final metrics differ"
    assert a[1] == b[1], "multi-size evaluation differs"
    assert a[2] == b[2], "metrics.csv differs"
    assert a[3].keys() == b[3].keys() and all(torch.equal(a[3][k], b[3][k]) for k in a[3])


def test_sigkill_mid_epoch_then_resume_equals_uninterrupted(setup):
    tmp, args, main = setup
    # step 8 = batch 1 of epoch 2: the last checkpoint is epoch 1's, written at step 7, the step of
    # that epoch's TensorBoard scalars (issue 19, item 2: a resume purged them)
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "VISPE_TEST_SIGNAL_AT_STEP": "8:KILL"}
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "train.run_name=killed"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run = tmp / "runs" / "killed"
    state = torch.load(run / "learned_abs" / "checkpoint.pt", weights_only=True)
    assert state["progress"]["step"] == 7 and state["progress"]["epoch"] == 1 and state["progress"]["batch"] == 0
    assert not list(run.glob("**/*.tmp"))  # no half-written file left behind
    assert not (run / "learned_abs" / "summary.json").exists()
    assert main(args + ["train.run_name=killed", "--resume"]) == 0
    _assert_same(_results(tmp / "runs" / "straight"), _results(run))
    _assert_same_tensorboard(tmp / "runs" / "straight", run)


def test_ctrl_c_saves_a_checkpoint_and_resume_equals_uninterrupted(setup, monkeypatch, capsys):
    tmp, args, main = setup
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN when started in the background (nohup)
    monkeypatch.setenv("VISPE_TEST_SIGNAL_AT_STEP", "5:INT")  # Ctrl-C during epoch 1
    assert main(args + ["train.run_name=ctrlc"]) == 130
    # the README's command (issue 28, item 8), with the run's stored config
    assert f"Continue with: python train.py --config {tmp / 'runs' / 'ctrlc' / 'config.yaml'} --resume" in \
        capsys.readouterr().err
    state = torch.load(tmp / "runs/ctrlc/learned_abs/checkpoint.pt", weights_only=True)
    assert state["progress"]["step"] == 5 and state["progress"]["batch"] == 5
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler restored
    monkeypatch.delenv("VISPE_TEST_SIGNAL_AT_STEP")
    assert main(args + ["train.run_name=ctrlc", "--resume"]) == 0
    _assert_same(_results(tmp / "runs" / "straight"), _results(tmp / "runs" / "ctrlc"))
    _assert_same_tensorboard(tmp / "runs" / "straight", tmp / "runs" / "ctrlc")


def test_a_resumed_run_s_events_read_back_after_the_stopped_run_s(tmp_path):
    """TensorBoard reads event files in name order, and the name starts with the creation second: a
    writer created in the same second as the stopped one (a resume in the same process) or on a
    machine whose clock is behind must still come last, or its steps read back first and the stopped
    run's orphaned steps are not purged (issue 28, item 5)."""
    import time

    from vispe.train.logging import RunLog

    log = RunLog(tmp_path)  # the stopped run: steps 1-5 checkpointed at 4, step 5 orphaned
    for step in range(1, 6):
        log.scalars(step, {"loss": float(step)}, "train")
    log.close()
    (old,) = (tmp_path / "tb").glob("*tfevents*")
    # as if written one second from now (a clock ahead, or the same second with a name that sorts after ours)
    ahead = int(time.time()) + 1
    old.rename(old.with_name(f"events.out.tfevents.{ahead:010d}.zzzz.99999.99"))
    log = RunLog(tmp_path, purge_step=5)
    for step in range(5, 8):
        log.scalars(step, {"loss": 10.0 * step}, "train")
    log.close()
    names = sorted(f.name for f in (tmp_path / "tb").glob("*tfevents*"))
    assert names[0].startswith(f"events.out.tfevents.{ahead:010d}.zzzz"), names
    rows = _scalars(tmp_path / "tb")["train/loss"]
    assert [(s, v) for s, _, v in rows] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 50.0), (6, 60.0), (7, 70.0)]


def test_resume_of_a_finished_run_trains_nothing_and_can_extend_it(setup, capsys):
    tmp, args, main = setup
    shutil.copytree(tmp / "runs/straight", tmp / "runs/extended")  # the other tests compare with "straight"
    for f in (tmp / "runs/extended").glob("**/config.yaml"):
        f.write_text(f.read_text().replace("run_name: straight", "run_name: extended"))
    files = ("learned_abs/checkpoint.pt", "learned_abs/metrics.csv", "summary.json", "comparison.md")
    before = [(tmp / "runs/extended" / f).read_bytes() for f in files]
    assert main(args + ["train.run_name=extended", "--resume"]) == 0
    assert "already finished" in capsys.readouterr().out
    assert [(tmp / "runs/extended" / f).read_bytes() for f in files] == before
    # more epochs: training continues from the last checkpoint (train.epochs may change on resume)
    assert main(args + ["train.run_name=extended", "--resume", "train.epochs=3"]) == 0
    out = capsys.readouterr().out
    assert "learning-rate schedule" in out and "min_lr" in out  # says what it does (issue 19, item 7)
    summary = json.loads((tmp / "runs/extended/learned_abs/summary.json").read_text())
    assert summary["epochs"] == 3 and summary["steps"] == 21 and summary["final"]["epoch"] == 3
    # the first two epochs are the original ones (a restart would differ: its schedule spans 3 epochs)
    assert _results(tmp / "runs/extended")[2][:2] == _results(tmp / "runs/straight")[2]
    # the schedule had reached optim.min_lr: the new epoch stays there (no jump back up the cosine)
    lrs = dict(_tensorboard(tmp / "runs/extended")["train/lr"])
    assert lrs[14] == pytest.approx(1e-5, rel=1e-4)
    assert [lrs[s] for s in range(15, 22)] == pytest.approx([1e-5] * 7, rel=1e-4)


def test_resume_with_fewer_epochs_than_done_is_refused(setup, capsys):
    tmp, args, main = setup
    shutil.copytree(tmp / "runs/straight", tmp / "runs/shorter")
    for f in (tmp / "runs/shorter").glob("**/config.yaml"):
        f.write_text(f.read_text().replace("run_name: straight", "run_name: shorter"))
    for f in (tmp / "runs/shorter").glob("**/summary.json"):  # as if stopped before its final evaluation
        f.unlink()
    assert main(args + ["train.run_name=shorter", "--resume", "train.epochs=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: ") and "train.epochs=1" in err and "14 steps" in err, err
