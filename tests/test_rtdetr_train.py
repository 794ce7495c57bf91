"""RT-DETR through train.py (``configs/shapes_rtdetr.yaml``, ``detr.decoder=rtdetr``): two training steps on the
shapes set with a finite, decreasing-capable loss; the config's options reach the model; unread keys refused."""
from pathlib import Path

import pytest
import torch

from vispe.models.detr.realtime import RTDETR
from vispe.train import config as C
from vispe.train.runner import build_optimizer
from vispe.train.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["detr.d_model=32", "detr.dim_feedforward=64", "detr.num_queries=8", "detr.dec_layers=2", "data.batch_size=2"]


def task_and_model(extra=()):
    cfg = C.load_config(ROOT / "configs/shapes_rtdetr.yaml", [*SMALL, *extra])
    task = get_task(cfg.task)
    info = task.info(cfg)
    return cfg, task, task.model(cfg, info, 64)


def test_two_training_steps_on_shapes_have_a_finite_loss():
    cfg, task, model = task_and_model()
    assert isinstance(model, RTDETR) and model.encoder.aifi[0].pe_name == "sincos2d"
    assert model.encoder.aifi[0].pe.mask_aware and model.num_queries == 8 and len(model.decoder.layers) == 2
    data = task.dataset(cfg, "train", 64)
    batch = task.collate_fn([data[i] for i in range(2)])
    opt = build_optimizer(cfg, model, task)
    model.train()
    for _ in range(2):
        loss, sums = task.step(model, batch, "cpu")
        assert torch.isfinite(loss) and loss > 0
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
    _, losses, _ = task._forward(model, batch, "cpu")
    assert "loss_ce_dn_0" in losses and "loss_ce_enc" in losses  # denoising groups and the encoder's top-k
    model.eval()
    with torch.no_grad():
        _, losses, _ = task._forward(model, batch, "cpu")
    assert "loss_ce_dn_0" not in losses


def test_the_encoding_is_swapped_by_config_and_unread_keys_are_refused():
    _, _, model = task_and_model(["model.pe=rope_mixed", "model.pe_kwargs={}"])
    assert {layer.self_attn.pe.family for layer in model.encoder.aifi[0].layers} == {"rotary"}
    with pytest.raises(ValueError, match="detr.box_bias"):
        task_and_model(["detr.box_bias=boxrpb"])


def test_coco_config_builds_rtdetr_r50vd_and_timm_resnet50d_weights_load(tmp_path):
    import timm

    from vispe.train.detection_rtdetr import build_for_task
    cfg = C.load_config(ROOT / "configs/coco_rtdetr.yaml", ["detr.backbone_weights=random"])
    model, _ = build_for_task(cfg, 80)
    assert model.backbone.channels == [512, 1024, 2048] and model.num_queries == 300
    timm_r50d = timm.create_model("resnet50d", pretrained=False).eval()
    path = tmp_path / "resnet50d.pth"
    torch.save(timm_r50d.state_dict(), path)
    cfg = C.load_config(ROOT / "configs/coco_rtdetr.yaml", [f"detr.backbone_weights={path}", "detr.dec_layers=1"])
    model, _ = build_for_task(cfg, 80)
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        want = timm_r50d.forward_features(x)
        got = model.backbone.eval()(x)[-1]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
