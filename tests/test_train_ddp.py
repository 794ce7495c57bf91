"""Data-parallel training on CPU: torchrun with 2 processes and the gloo backend.

The metrics the two processes reduce (each evaluates half of the test set) must equal what one
process computes on the whole test set with the saved weights; only rank 0 writes files.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vispe.train import config as C, distributed as D, engine, loaders
from vispe.train.checkpoint import load
from vispe.train.distributed import DistInfo
from vispe.train.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    args = [f"train.out_dir={tmp}", "train.run_name=ddp", "data.kwargs.n_train=64", "data.kwargs.n_test=37",
            "data.batch_size=16", "data.eval_batch_size=5", "model.embed_dim=32", "model.num_heads=2",
            "model.depth=2", "train.epochs=2", "train.eval_sizes=[0.75,1.0,1.5]", "train.progress=false",
            "train.compare=[]", "train.device=cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "train.py"), *args], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "ddp", proc


def test_reduced_metrics_equal_one_process_on_the_same_data(ddp_run):
    out, _ = ddp_run
    sub = out / "learned_abs"
    summary = json.loads((sub / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2 * 2  # 64 samples / 2 ranks / 16 per batch
    cfg = C.load_config(sub / "config.yaml")
    task = get_task(cfg.task)
    info = task.info(cfg)
    model = task.model(cfg, info, 32)
    model.load_state_dict(load(sub / "checkpoint.pt")["model"])
    assert sorted(map(int, summary["eval"])) == [24, 32, 48]
    for size, got in summary["eval"].items():
        ds = task.dataset(cfg, "test", int(size))
        assert len(ds) == 37  # odd: the two ranks hold 19 and 18 samples, none counted twice
        one = engine.evaluate(model, task, loaders.eval_loader(ds, batch_size=64, dist_info=DistInfo()),
                              device=torch.device("cpu"), amp_dtype=None)
        assert got["acc"] == one["acc"]
        assert got["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
    assert summary["final"]["test_acc"] == summary["eval"]["32"]["acc"]


def test_only_rank_0_writes(ddp_run):
    out, proc = ddp_run
    sub = out / "learned_abs"
    assert len(list((sub / "tb").iterdir())) == 1  # one TensorBoard events file
    assert (sub / "metrics.csv").read_text().count("\n") == 3  # header + 2 epochs, written once
    assert proc.stdout.count("[learned_abs] final:") == 1 and proc.stdout.count("run folder:") == 1


def test_shards_partition_the_data_and_sums_reduce():
    n = 37
    shards = [list(D.shard_indices(n, DistInfo(rank=r, world_size=3))) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(n))  # each sample exactly once
    sums = {"count": torch.tensor(5.0, dtype=torch.float64)}
    assert D.all_reduce_sums(sums) is sums  # one process: unchanged
    assert loaders.num_train_batches(64, 16, DistInfo(rank=0, world_size=2)) == 2
    assert loaders.num_train_batches(65, 16, DistInfo(rank=0, world_size=2)) == 3  # padded to 33 per rank
