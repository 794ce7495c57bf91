"""train.py trains the positioned-query designs: the detr.decoder / dec_pe / box_bias keys reach the
model, a sigmoid class head gets the focal loss and cost, and the run evaluates and draws."""
from __future__ import annotations

import json
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
], ids=["conditional", "dab-rope_axial", "dab-boxrpb-prelu"])
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
