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


@pytest.mark.parametrize("extra", [[], ["model.pe=rope_mixed", "model.pe_kwargs={}"]], ids=["sincos2d", "rope_mixed"])
def test_a_trained_checkpoint_reloads_with_the_same_outputs(tmp_path, extra):
    """A train.py checkpoint (``vispe.train.checkpoint.save``, as the runner writes it) reloads through the
    loader train.py runs use for every design, ``vispe.analysis.trained.load_run_model``, and gives the trained
    model's outputs on a padded batch, bit for bit."""
    from omegaconf import OmegaConf

    from vispe.analysis.trained import load_run_model
    from vispe.train import checkpoint as ckpt

    cfg, task, model = task_and_model(extra)
    data = task.dataset(cfg, "train", 64)
    images, mask, targets = task.collate_fn([data[i] for i in range(2)])
    assert mask.any()  # two sizes, one padded
    opt = build_optimizer(cfg, model, task)
    model.train()
    loss, _ = task.step(model, (images, mask, targets), "cpu")
    loss.backward()
    opt.step()
    config = OmegaConf.to_container(cfg, resolve=True)
    folder = tmp_path / cfg.model.pe
    folder.mkdir()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    ckpt.save(folder / "checkpoint.pt", model=model, optimizer=opt, scheduler=sched, scaler=None,
              progress=ckpt.Progress(), config=config)
    loaded, loaded_cfg = load_run_model(folder)
    assert isinstance(loaded, RTDETR) and not loaded.training and loaded_cfg["model"]["pe"] == cfg.model.pe
    model.eval()
    with torch.no_grad():
        want, got = model(images, mask), loaded(images, mask)
    assert torch.equal(got["pred_logits"], want["pred_logits"]) and torch.equal(got["pred_boxes"], want["pred_boxes"])
    assert not torch.equal(got["pred_boxes"], task_and_model(extra)[2].eval()(images, mask)["pred_boxes"])  # trained


@pytest.mark.slow
@pytest.mark.parametrize("config", ["shapes_rtdetr", "shapes_dfine"])
def test_smoke_run_of_the_realtime_configs(tmp_path, config):
    """``train.py --config configs/<config>.yaml --smoke`` trains, evaluates at the three sizes and leaves a
    checkpoint that ``load_run_model`` rebuilds with its weights; D-FINE's run has D-FINE's decoder and loss."""
    import json

    from conftest import load_train_main
    from vispe.analysis.trained import load_run_model
    from vispe.models.detr.realtime.dfine_decoder import DFineDecoder
    args = ["--config", str(ROOT / f"configs/{config}.yaml"), "--smoke", "data.train_subset=16", "data.test_subset=8",
            "train.compare=[]", "task.vis_images=0", "train.progress=false", "train.device=cpu", "train.threads=1",
            f"train.out_dir={tmp_path}", "train.run_name=rt"]
    assert load_train_main()(args) == 0
    run = tmp_path / "rt" / "sincos2d"
    s = json.loads((run / "summary.json").read_text())
    assert s["finished"] and len(s["eval"]) == 3 and s["label"] == f"sincos2d ({config.split('_')[1]})"
    model, cfg = load_run_model(run)
    state = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert isinstance(model.decoder, DFineDecoder) == (config == "shapes_dfine")
    if config == "shapes_dfine":
        assert model.decoder.layers[0].encoder_attn.points == [3, 6, 3]
        with pytest.raises(ValueError, match="detr.decoder_kwargs.weight_fgl=0.3: D-FINE's loss weights need"):
            task_and_model(["detr.decoder_kwargs.weight_fgl=0.3"])


def test_coco_dfine_config_builds_dfine_on_resnet50d():
    from vispe.models.detr.realtime.dfine_decoder import DFineDecoder
    from vispe.train.detection_rtdetr import build_for_task
    cfg = C.load_config(ROOT / "configs/coco_dfine.yaml", ["detr.backbone_weights=random", "detr.dec_layers=1"])
    model, criterion = build_for_task(cfg, 80)
    assert isinstance(model.decoder, DFineDecoder) and model.decoder.num_bins == 32 and model.num_queries == 300
    assert model.backbone.channels == [512, 1024, 2048] and model.decoder.layers[0].encoder_attn.points == [3, 6, 3]
    assert (criterion.weights["loss_fgl"], criterion.weights["loss_ddf"]) == (0.15, 1.5)
