"""Tasks: what to build and how to score a batch, named by ``task.name`` in the config.

The training loop (``vispe.train.engine``) is generic; everything task-specific lives in a task
object with this interface, so that detection (DETR on COCO) is one more entry in ``TASKS``:

``info(cfg)``                       the data set's DatasetInfo (classes, channels, native size)
``dataset(cfg, split, img_size)``   a torch Dataset for ``split`` ("train" / "test") at ``img_size``
``model(cfg, info, img_size)``      the nn.Module for ``cfg.model`` (encoding ``cfg.model.pe``)
``collate_fn``                      the DataLoader's collate function (None = torch's default)
``step(model, batch, device, train)`` ``(loss, sums)``: the mean loss to back-propagate and a dict of
                                    per-batch sums (float64, detached) that add up across batches
                                    and processes, ``sums["count"]`` = number of samples
``metrics(sums)``                   metric name -> value from summed ``sums`` (e.g. loss, acc)
``sum_keys``                        the keys of ``sums`` (zeros stand in for a process with no data)
``primary``                         the metric compared across encodings (higher is better)
``evaluate(model, loader, ...)``    optional: replaces ``engine.evaluate`` for metrics that are not
                                    sums over samples (COCO mAP gathers predictions instead)
``check_config(cfg)``               classmethod: value checks of the task's own keys (``config.validate``
                                    refuses the keys that only another task reads, ``own_keys``)
``param_groups(model, cfg)``        optional: the optimiser's parameter groups (DETR: backbone lr)
``visualize(model, dataset, path, device)`` optional: a picture of predictions after each evaluation
``label(cfg)``                      how a run is named in the console, comparison.md and a sweep's
                                    report: the encoding, plus what else tells variants apart
                                    (detection: the design when it is not DETR's own)

Tasks: ``classification`` (here) and ``detection`` (``vispe.train.detection``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from vispe.train.config_words import check_encodings, reword
from vispe.train.detection import DetectionTask

#: model fields passed to create_vit only when set (None keeps the preset's value)
OPTIONAL_MODEL_FIELDS = ("embed_dim", "depth", "num_heads", "mlp_ratio", "class_token", "global_pool",
                         "reg_tokens", "drop_path_rate")


class ClassificationTask:
    """Image classification with cross-entropy; metrics: mean loss and top-1 accuracy."""

    primary = "acc"
    collate_fn = None
    sum_keys = ("loss", "correct", "count")

    #: config keys only this task reads (another task refuses them when they are changed)
    own_keys = ("task.label_smoothing", "model.kwargs", *(f"model.{k}" for k in OPTIONAL_MODEL_FIELDS))

    def __init__(self, task_cfg: DictConfig):
        self.label_smoothing = float(task_cfg.label_smoothing)

    @classmethod
    def check_config(cls, cfg: DictConfig) -> None:
        """Nothing beyond the schema (``config.validate`` refuses the other tasks' ``own_keys``)."""

    @staticmethod
    def label(cfg: DictConfig) -> str:
        """The encoding's name."""
        return cfg.model.pe

    def info(self, cfg: DictConfig):
        from vispe.data import dataset_info

        return dataset_info(cfg.data.name, **cfg.data.kwargs)

    def dataset(self, cfg: DictConfig, split: str, img_size: int | None = None):
        from vispe.data import build_dataset

        d = cfg.data
        return build_dataset(d.name, split, root=d.root, img_size=img_size, seed=d.seed, download=d.download,
                             train_augment=d.train_augment, **d.kwargs)

    def model(self, cfg: DictConfig, info, img_size: int) -> torch.nn.Module:
        from vispe.models.vit import create_vit

        m = cfg.model
        check_encodings({"model.pe": m.pe})
        kw = {k: m[k] for k in OPTIONAL_MODEL_FIELDS if m[k] is not None}
        clash = sorted(set(kw) & set(m.kwargs))
        if clash:
            raise ValueError(f"model.kwargs sets {clash}, which are also set as model.{clash[0]}: set each once")
        try:
            return create_vit(m.name, pe=m.pe, img_size=img_size, patch_size=m.patch_size,
                              num_classes=info.num_classes, in_chans=info.in_chans,
                              pe_kwargs=dict(m.pe_kwargs) or None, **kw, **m.kwargs)
        except (TypeError, ValueError) as e:  # worded by argument: name the config keys instead
            keys = {"pe": "model.pe", "pe_kwargs": "model.pe_kwargs", "patch_size": "model.patch_size",
                    "img_size": "data.img_size", **{k: f"model.{k}" for k in OPTIONAL_MODEL_FIELDS}}
            raise ValueError(reword(str(e), keys, {m.pe: "model.pe_kwargs"})) from e

    def step(self, model, batch, device, *, train: bool = True):
        images, labels = batch
        images = images.to(device, non_blocking=True)  # (B, C, H, W)
        labels = labels.to(device, non_blocking=True)  # (B,)
        logits = model(images)  # (B, num_classes)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing if train else 0.0)
        with torch.no_grad():
            n = labels.numel()
            sums = {"loss": loss.detach().double() * n,
                    "correct": (logits.argmax(-1) == labels).sum().double(),
                    "count": torch.tensor(float(n), dtype=torch.float64, device=labels.device)}
        return loss, sums

    def metrics(self, sums: dict) -> dict:
        n = max(float(sums["count"]), 1.0)
        return {"loss": float(sums["loss"]) / n, "acc": float(sums["correct"]) / n}


TASKS = {"classification": ClassificationTask, "detection": DetectionTask}


def get_task(task_cfg: DictConfig):
    """The task object named by ``task_cfg.name``, built from its section of the config."""
    if task_cfg.name not in TASKS:
        raise ValueError(f"task.name={task_cfg.name!r}: expected one of {', '.join(map(repr, TASKS))}")
    return TASKS[task_cfg.name](task_cfg)
