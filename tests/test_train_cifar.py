"""configs/cifar10_vit.yaml end to end on the miniature CIFAR-10 (real on-disk format, real loader):
every file of the run folder is there and says the same thing as the others."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import load_train_main
from vispe.data import build_dataset
from vispe.data.miniature import write_miniature_cifar10
from vispe.train import config as C, engine, loaders
from vispe.train.checkpoint import load
from vispe.train.distributed import DistInfo
from vispe.train.runner import eval_size
from vispe.train.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]



@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cifar")
    write_miniature_cifar10(tmp / "data", n_per_batch=20, seed=0)
    args = ["--config", str(ROOT / "configs/cifar10_vit.yaml"), "--smoke", f"data.root={tmp / 'data'}",
            "data.kwargs.verify_md5=false", f"train.out_dir={tmp / 'runs'}", "train.progress=false",
            "train.epochs=2", "train.compare=[none]", "model.embed_dim=32", "model.num_heads=2", "model.depth=2"]
    assert load_train_main()(args) == 0
    return tmp / "runs" / "cifar10_vit_smoke", tmp


def test_run_folder_holds_every_artefact(run):
    out, _ = run
    assert sorted(p.name for p in out.iterdir()) == [".vispe-smoke-run", "comparison.md", "comparison.png", "config.yaml",
                                                     "learned_abs", "none", "summary.json"]  # a --smoke run: marked
    for pe in ("learned_abs", "none"):
        sub = out / pe
        assert {"checkpoint.pt", "config.yaml", "curves.png", "metrics.csv", "summary.json", "tb"} <= {p.name for p in sub.iterdir()}
        for png in (sub / "curves.png", out / "comparison.png"):
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert not list(sub.glob("*.tmp"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and list(summary["encodings"]) == ["learned_abs", "none"]
    table = (out / "comparison.md").read_text()
    assert "| learned_abs |" in table and "| none |" in table and "test acc @48px" in table


def test_stored_config_is_the_resolved_one(run):
    out, tmp = run
    cfg = C.load_config(out / "config.yaml")
    assert cfg.data.name == "cifar10" and cfg.data.root == str(tmp / "data") and cfg.train.epochs == 2
    assert cfg.model.name == "vit_pico" and cfg.model.depth == 2 and cfg.train.run_name == "cifar10_vit_smoke"
    sub = OmegaConf.load(out / "none" / "config.yaml")
    assert sub.model.pe == "none" and list(sub.train.compare) == []


def test_csv_tensorboard_checkpoint_and_summary_agree(run):
    out, _ = run
    sub = out / "learned_abs"
    with open(sub / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    summary = json.loads((sub / "summary.json").read_text())
    assert summary["finished"] and summary["epochs"] == 2 and summary["world_size"] == 1
    assert float(rows[-1]["test_acc"]) == summary["final"]["test_acc"]
    state = load(sub / "checkpoint.pt")
    assert state["encoding"] == "learned_abs" and state["progress"]["epoch"] == 2
    assert state["progress"]["step"] == summary["steps"] == int(rows[-1]["step"])
    assert {"torch", "numpy", "python", "cuda"} <= set(state["rng"]) and state["optimizer"]["state"]
    acc = EventAccumulator(str(sub / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert {"epoch/test_acc", "epoch/train_loss", "train/loss", "train/lr"} <= set(tags)
    assert [e.value for e in acc.Scalars("epoch/test_loss")] == pytest.approx([float(r["test_loss"]) for r in rows])


def test_multi_size_evaluation_matches_an_independent_evaluation(run):
    """summary.json's per-size numbers are those of the saved model on the test set rendered at that size."""
    out, tmp = run
    sub = out / "learned_abs"
    summary = json.loads((sub / "summary.json").read_text())
    cfg = C.load_config(sub / "config.yaml")
    assert sorted(map(int, summary["eval"])) == [eval_size(32, s, 4) for s in (0.75, 1.0, 1.5, 2.0)] == [24, 32, 48, 64]
    # 1x is the model's test metric of the last epoch
    assert summary["eval"]["32"]["acc"] == summary["final"]["test_acc"]
    assert summary["eval"]["32"]["loss"] == pytest.approx(summary["final"]["test_loss"], rel=1e-6)
    task = get_task(cfg.task)
    model = task.model(cfg, task.info(cfg), 32)
    model.load_state_dict(load(sub / "checkpoint.pt")["model"])
    for size in (24, 64):
        ds = build_dataset("cifar10", "test", root=str(tmp / "data"), img_size=size, verify_md5=False)
        assert ds[0][0].shape == (3, size, size)
        got = engine.evaluate(model, task, loaders.eval_loader(ds, batch_size=7, dist_info=DistInfo()),
                              device=torch.device("cpu"), amp_dtype=None)
        assert got["acc"] == summary["eval"][str(size)]["acc"]
        assert got["loss"] == pytest.approx(summary["eval"][str(size)]["loss"], rel=1e-5)
