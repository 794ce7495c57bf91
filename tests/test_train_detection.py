"""train.py detects: a miniature COCO folder in the real on-disk format through the real loader,
transforms, DETR, COCOeval, checkpoints, exact resume after SIGKILL, and two-process DDP."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import load_train_main
from vispe.data.miniature_coco import write_miniature_coco
from vispe.train import config as C, engine, loaders
from vispe.train.checkpoint import load
from vispe.train.distributed import DistInfo
from vispe.train.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("epoch_time_s", "img_per_s")
AP_KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl")


def tiny_args(tmp: Path, coco: Path) -> list[str]:
    return ["--config", str(ROOT / "configs/shapes_detr.yaml"), "data.name=coco", f"data.root={coco}",
            "data.img_size=48", "data.max_size=80", "data.batch_size=3", "data.eval_batch_size=4",
            "detr.backbone_widths=[8,8,16,16]", "detr.d_model=16", "detr.nheads=2", "detr.enc_layers=1",
            "detr.dec_layers=1", "detr.dim_feedforward=32", "detr.num_queries=4", "train.epochs=2",
            "train.eval_every=1", "train.eval_sizes=[1.0,1.5]", "train.compare=[]", "train.progress=false",
            "task.vis_images=2", "optim.warmup_epochs=0.5", f"train.out_dir={tmp / 'runs'}", "train.device=cpu"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("det")
    coco = write_miniature_coco(tmp / "coco", n_images=7, seed=0)  # 7 train (3 batches), 7 val images
    args = tiny_args(tmp, coco)
    main = load_train_main()
    assert main(args + ["train.run_name=straight", "train.ckpt_every_steps=2", "train.compare=[none]"]) == 0
    return tmp, args, main


def test_detection_run_writes_coco_metrics_pictures_and_a_comparison(setup):
    tmp = setup[0]
    run = tmp / "runs" / "straight"
    summary = json.loads((run / "sine" / "summary.json").read_text())
    assert summary["primary"] == "AP" and summary["task"] == "detection" and summary["steps"] == 6
    assert sorted(map(int, summary["eval"])) == [48, 72]
    for metrics in summary["eval"].values():
        # COCOeval's -1 (no object of a size) is left out, never logged as a score (issue 53)
        assert {"AP", "AP50", "AP75"} <= set(metrics) and all(0.0 <= metrics[k] <= 1.0 for k in AP_KEYS if k in metrics)
        assert metrics["loss"] > 0
    with open(run / "sine" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(r["test_AP"] != "" and float(r["train_loss"]) > 0 for r in rows)
    assert not any(v.strip() in ("-1", "-1.0") for r in rows for v in r.values())
    assert (run / "sine" / "predictions" / "epoch_001.png").is_file()
    assert (run / "sine" / "predictions" / "epoch_002.png").stat().st_size > 0
    table = (run / "comparison.md").read_text()
    # issue 41, item 6: a run is labelled by its design too (shapes_detr.yaml: DAB-DETR with BoxRPB)
    assert "test AP @48px" in table and "| none (dab, boxrpb) |" in table and "| sine (dab, boxrpb) |" in table
    assert summary["label"] == "sine (dab, boxrpb)"
    final_line = setup[2].__globals__["final_line"]  # the console's last line of a run (train.py)
    assert final_line(summary).startswith("[sine (dab, boxrpb)] final: AP@48px")


def test_sigkill_then_resume_equals_uninterrupted(setup):
    tmp, args, main = setup
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "VISPE_TEST_SIGNAL_AT_STEP": "4:KILL"}  # step 4 = batch 1 of epoch 2
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "train.run_name=killed",
                           "train.ckpt_every_steps=2"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert main(args + ["train.run_name=killed", "train.ckpt_every_steps=2", "--resume"]) == 0

    def results(run):
        s = json.loads((run / "sine" / "summary.json").read_text())
        with open(run / "sine" / "metrics.csv") as f:
            rows = [{k: v for k, v in r.items() if k not in TIMING} for r in csv.DictReader(f)]
        w = torch.load(run / "sine" / "checkpoint.pt", weights_only=True)["model"]
        return {k: v for k, v in s["final"].items() if k not in TIMING}, s["eval"], rows, w

    a, b = results(tmp / "runs" / "straight"), results(tmp / "runs" / "killed")
    assert a[0] == b[0] and a[1] == b[1] and a[2] == b[2]
    assert all(torch.equal(a[3][k], b[3][k]) for k in a[3])


def test_ddp_two_processes_ap_equals_one_process(setup):
    tmp, args, _ = setup
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "train.py"), *args, "train.run_name=ddp"], env=env, capture_output=True,
                          text=True, timeout=600, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sub = tmp / "runs" / "ddp" / "sine"
    summary = json.loads((sub / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2 * 2  # 7 images / 2 ranks -> 4 each, 2 batches
    cfg = C.load_config(sub / "config.yaml")
    task = get_task(cfg.task)
    model = task.model(cfg, task.info(cfg), 48)
    model.load_state_dict(load(sub / "checkpoint.pt")["model"])
    for size, got in summary["eval"].items():
        ds = task.dataset(cfg, "test", int(size))
        one = engine.evaluate(model, task, loaders.eval_loader(ds, batch_size=4, dist_info=DistInfo(),
                                                               collate_fn=task.collate_fn),
                              device=torch.device("cpu"), amp_dtype=None)
        for k in AP_KEYS:  # the same predictions, gathered from two processes or made by one
            assert (k in got) == (k in one), (size, k)  # COCO's -1 (no object of a size) left out by both
            if k in got:
                assert got[k] == pytest.approx(one[k], abs=1e-6), (size, k)
        assert "AP" in got and "AP50" in got
        # (the test loss is not compared: DETR divides it by the boxes of each batch, so it depends on
        # how the images are batched, which differs between two shards and one process)
        assert got["loss"] > 0 and one["loss"] > 0
    assert proc.stdout.count("[sine (dab, boxrpb)] final:") == 1  # the label names the design (issue 41)


def test_a_corrupt_image_mid_run_is_an_error_naming_it_and_keeps_what_was_written(tmp_path):
    coco = write_miniature_coco(tmp_path / "coco", n_images=4, seed=1)
    args = tiny_args(tmp_path, coco) + ["train.run_name=corrupt", "train.epochs=1", "train.eval_sizes=[1.0]",
                                        "task.vis_images=0"]
    main = load_train_main()
    assert main(args) == 0
    sub = tmp_path / "runs" / "corrupt" / "sine"
    before = {f: (sub / f).read_bytes() for f in ("checkpoint.pt", "metrics.csv")}
    bad = sorted((coco / "train2017").iterdir())[1]
    bad.write_bytes(bad.read_bytes()[:40])  # truncated
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "train.epochs=2", "--resume"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"train.py: error: COCO image file {bad}" in proc.stderr and "cannot be decoded" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert {f: (sub / f).read_bytes() for f in before} == before


def test_cocos_minus_one_is_left_out_and_said_once():
    """COCOeval gives -1 for a size with no ground truth: undefined, not a score (issue 53)."""
    from vispe.train import detection

    detection._SAID.clear()
    said: list[str] = []
    got = detection.absent_sizes({"AP": 0.5, "AP50": 0.9, "APs": 0.0, "APm": -1.0, "APl": -1.0}, say=said.append)
    assert got == {"AP": 0.5, "AP50": 0.9, "APs": 0.0}  # 0.0 is a score, kept
    assert len(said) == 1 and "APl, APm" in said[0] and "-1" in said[0]
    assert detection.absent_sizes({"AP": 0.4, "APl": -1.0}, say=said.append) == {"AP": 0.4}
    assert len(said) == 1  # once per process
