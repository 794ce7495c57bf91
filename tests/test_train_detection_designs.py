"""train.py trains the positioned-query designs: the detr.decoder / dec_pe / box_bias keys reach the
model, a sigmoid class head gets the focal loss and cost, the run evaluates and draws, and two DDP
processes train every design with every family of key positions."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_train_main
from vispe.data.miniature_coco import write_miniature_coco
from vispe.train import config as C
from vispe.train.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]


def args_for(tmp: Path, coco: Path, *extra: str) -> list[str]:
    return ["--config", str(ROOT / "configs/shapes_detr.yaml"), "data.name=coco", f"data.root={coco}",
            "data.img_size=48", "data.max_size=80", "data.batch_size=3", "detr.backbone_widths=[8,8,16,16]",
            "detr.d_model=16", "detr.nheads=2", "detr.enc_layers=1", "detr.dec_layers=2", "detr.dim_feedforward=32",
            "detr.num_queries=4", "train.epochs=1", "train.eval_sizes=[1.0]", "train.compare=[]", "train.progress=false",
            "task.vis_images=1", f"train.out_dir={tmp / 'runs'}", "train.device=cpu", *extra]


@pytest.mark.parametrize("extra", [
    ("detr.decoder=conditional", "detr.box_bias=null"),
    ("detr.decoder=dab", "detr.dec_pe=rope_axial", "detr.box_bias=null"),
    ("detr.decoder=dab", "detr.box_bias=boxrpb", "detr.box_bias_kwargs.hidden=8", "detr.activation=prelu"),
    ("detr.attention=deformable", "detr.decoder=dab", "detr.box_bias=null", "detr.d_model=32", "detr.num_feature_levels=2",
     "detr.backbone_levels=1", "detr.n_points=2"),
    ("detr.attention=deformable", "detr.decoder=dino", "detr.decoder_kwargs={dn_number: 2}", "detr.box_bias=null",
     "detr.d_model=32", "detr.num_feature_levels=2", "detr.backbone_levels=1", "detr.n_points=2"),
], ids=["conditional", "dab-rope_axial", "dab-boxrpb-prelu", "dab-deformable", "dino"])
def test_positioned_designs_train_evaluate_and_draw(tmp_path, extra):
    coco = write_miniature_coco(tmp_path / "coco", n_images=4, seed=0)
    name = "run"
    assert load_train_main()(args_for(tmp_path, coco, *extra, f"train.run_name={name}")) == 0
    run = tmp_path / "runs" / name / "sine"
    summary = json.loads((run / "summary.json").read_text())
    metrics = next(iter(summary["eval"].values()))
    assert -1.0 <= metrics["AP"] <= 1.0 and metrics["loss"] > 0
    assert (run / "predictions" / "epoch_001.png").is_file()


def test_a_sigmoid_head_gets_the_focal_criterion_and_a_softmax_head_does_not():
    for decoder, focal in (("dab", 0.25), ("detr", None)):
        cfg = C.load_config(ROOT / "configs/shapes_detr.yaml", [f"detr.decoder={decoder}", "detr.box_bias=null", "detr.d_model=16",
                                                                "detr.nheads=2", "detr.num_queries=4"])
        task = get_task(cfg.task)
        model = task.model(cfg, task.info(cfg), 64)
        assert task.criterion.focal_alpha == focal and task.criterion.matcher.focal_alpha == focal
        assert model.class_head == ("sigmoid" if focal else "softmax")


DDP_DESIGNS = {  # design -> encodings trained after it (train.compare): rotary keys, keys without position
    "detr": (("detr.decoder=detr", "detr.box_bias=null", "task.weight_ce=1", "task.cost_class=1", "model.pe_kwargs={}"),
             "[learned_rowcol]"),
    "conditional": (("detr.decoder=conditional", "detr.box_bias=null"), "[rope_axial,none]"),
    "dab-boxrpb-relation": (("detr.decoder=dab", "detr.query_relation=relation", "detr.box_bias_kwargs.hidden=8"),
                            "[rope_mixed,none]"),
    "deformable-two-stage-relation": (("detr.attention=deformable", "detr.decoder=deformable", "detr.box_bias=null",
                                       "detr.decoder_kwargs={with_box_refine: true, two_stage: true}",
                                       "detr.query_relation=relation", "detr.d_model=32", "detr.num_feature_levels=2",
                                       "detr.backbone_levels=1", "detr.n_points=2"), "[none]"),
    "dino": (("detr.attention=deformable", "detr.decoder=dino", "detr.decoder_kwargs={dn_number: 2}", "detr.box_bias=null",
              "detr.d_model=32", "detr.num_feature_levels=2", "detr.backbone_levels=1", "detr.n_points=2"), "[none]"),
}
DRIVER = """import importlib.util, json, sys
import torch.distributed as dist
from vispe.train import distributed
spec = importlib.util.spec_from_file_location("train_script", sys.argv[1])
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
distributed.cleanup = lambda: None  # one process group for every run (started by the first)
for args in json.load(open(sys.argv[2])):
    assert train.main(args) == 0, args
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_process_ddp_trains_every_design_with_every_key_family(tmp_path):
    """One torchrun launch, two CPU processes (gloo), DDP without find_unused_parameters, train.py's main
    called once per design: two steps per process for the design with sine keys and its compare encodings
    (rotary keys, keys without position). A parameter without a gradient stops the second step
    ("Expected to have finished reduction in the prior iteration"), as the rotary and position-free rows
    did before issue 35."""
    coco = write_miniature_coco(tmp_path / "coco", n_images=4, seed=0)
    runs = [args_for(tmp_path, coco, *design, f"train.compare={compare}", "data.batch_size=1", "data.eval_batch_size=4",
                     "task.vis_images=0", f"train.run_name={name}") for name, (design, compare) in DDP_DESIGNS.items()]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(tmp_path / "driver.py"), str(ROOT / "train.py"), str(tmp_path / "runs.json")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the workers too, not only torchrun
        out, err = proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    for name, (_, compare) in DDP_DESIGNS.items():
        for pe in ["sine", *compare.strip("[]").split(",")]:
            summary = json.loads((tmp_path / "runs" / name / pe / "summary.json").read_text())
            assert summary["world_size"] == 2 and summary["steps"] == 2, (name, pe)  # 4 images / 2 ranks, batch 1
