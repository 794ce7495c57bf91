"""train.py trains the RF-DETR-style detector on the shapes set (configs/shapes_rfdetr*.yaml): two steps at
native aspect with padding masks and at a square resize give finite losses; Group-DETR's groups run in
training only; the loss is the set criterion per group, averaged; options the detector does not read are
refused by name."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from vispe.train import config as C
from vispe.train.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["detr.decoder_kwargs.embed_dim=32", "detr.decoder_kwargs.depth=2", "detr.decoder_kwargs.num_heads=2",
         "detr.d_model=32", "detr.dec_layers=1", "detr.dim_feedforward=64", "data.batch_size=4"]


def _two_steps(config: str, *extra: str):
    cfg = C.load_config(ROOT / config, [*SMALL, *extra])
    task = get_task(cfg.task)
    info = task.info(cfg)
    model = task.model(cfg, info, cfg.data.img_size)
    data = task.dataset(cfg, "train")
    batch = task.collate_fn([data[i] for i in range(4)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    losses = []
    for _ in range(2):
        loss, _ = task.step(model, batch, "cpu")
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return cfg, task, model, batch, losses


@pytest.mark.slow
@pytest.mark.parametrize("config", ["configs/shapes_rfdetr.yaml", "configs/shapes_rfdetr_square.yaml"])
def test_two_steps_finite(config):
    cfg, task, model, (images, mask, _), losses = _two_steps(config)
    assert all(math.isfinite(v) and v > 0 for v in losses)
    sizes = {tuple(t.shape[-2:]) for t in (images,)}
    if cfg.data.train_augment == "square":
        assert not mask.any() and images.shape[-2:] == (64, 64)  # every image resized to 64 x 64
    else:
        assert mask.any(), sizes  # native aspect: images of several shapes, padded, masked
    G, Q = model.queries.groups, model.num_queries
    model.train()
    assert model(images, mask)["pred_logits"].shape[1] == G * Q  # groups in training
    model.eval()
    with torch.no_grad():
        assert model(images, mask)["pred_logits"].shape[1] == Q  # one group at inference


def test_group_loss_is_the_mean_of_the_groups():
    cfg = C.load_config(ROOT / "configs/shapes_rfdetr.yaml", SMALL)
    task = get_task(cfg.task)
    model = task.model(cfg, task.info(cfg), 64)
    data = task.dataset(cfg, "train")
    images, mask, targets = task.collate_fn([data[i] for i in range(2)])
    model.train()
    torch.manual_seed(0)
    out = model(images, mask)
    G, Q = out["groups"], model.num_queries
    total = task.criterion(out, targets)["loss"]
    base = task.criterion.criterion
    per = []
    for g in range(G):
        part = {"pred_logits": out["pred_logits"][:, g * Q:(g + 1) * Q], "pred_boxes": out["pred_boxes"][:, g * Q:(g + 1) * Q],
                "class_head": "sigmoid",
                "aux_outputs": [{k: (v[:, g * Q:(g + 1) * Q] if k.startswith("pred") else v) for k, v in a.items()}
                                for a in out["aux_outputs"]],
                "enc_outputs": {k: (v[:, g * Q:(g + 1) * Q] if k.startswith("pred") else v)
                                for k, v in out["enc_outputs"].items()}}
        per.append(base(part, targets)["loss"])
    assert G == 3 and torch.allclose(total, sum(per) / G)
    assert not torch.allclose(per[0], per[1])


def test_unread_options_are_refused():
    cfg = C.load_config(ROOT / "configs/shapes_rfdetr.yaml", [*SMALL, "detr.enc_layers=3"])
    task = get_task(cfg.task)
    with pytest.raises(ValueError, match=r"detr.enc_layers"):
        task.model(cfg, task.info(cfg), 64)


def test_rope_mixed_replaces_the_table():
    cfg = C.load_config(ROOT / "configs/shapes_rfdetr.yaml", [*SMALL, "model.pe=rope_mixed"])
    task = get_task(cfg.task)
    model = task.model(cfg, task.info(cfg), 64)
    assert model.backbone.pos_embed is None and type(model.backbone.blocks[0].attn.pe).__name__ == "RopeMixed"
