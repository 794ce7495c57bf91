"""The detection task of train.py: a DETR-style detector on COCO-format data, scored by COCOeval.

    python train.py --config configs/shapes_detr.yaml           # embedded set, written on first use
    python train.py --config configs/coco_detr.yaml data.root=/data/coco detr.backbone_weights=/path/to/resnet50-0676ba61.pth

``task.name: detection`` plugs into the generic loop of ``vispe.train.engine`` (see
``vispe.train.tasks`` for the interface): batches are ``(images (B, 3, H, W), mask (B, H, W)
True = padding, targets)`` from ``vispe.data.detection.collate_detection``; the loss is DETR's
``SetCriterion``; evaluation runs the criterion (test loss) and gathers every prediction as COCO
result records (from every process), then ``vispe.data.coco_eval.coco_evaluate`` gives AP, AP50,
AP75, APs, APm, APl on exactly the images evaluated. ``primary`` is AP. COCOeval's -1 ("no object
of this size among the images evaluated", e.g. APl on the 64-96 px shapes set) is not a score: such a
metric is left out of the results (empty in ``metrics.csv``, no point in ``curves.png``), said once
per process (``absent_sizes``). After each evaluation a
picture of true boxes (green, class names) and predictions (red, class and score; the top 3 in
orange when none reaches ``task.vis_score``) on the first ``task.vis_images`` validation images,
magnified 4x with a legend, is written to ``predictions/epoch_NNN.png`` in the run folder
(``vispe.train.detection_vis``).
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from vispe.train.config_words import check_encodings, reword

LOSS_KEYS = ("loss", "loss_ce", "loss_bbox", "loss_giou")
#: create_detr's arguments that are not detr.* keys, by config key (the errors name the keys)
MODEL_KEYS = {"pe": "model.pe", "pe_kwargs": "model.pe_kwargs", "num_classes": "the data set's number of classes"}
HINTS = {"detr.grid": "detr.grid=[h, w] is the backbone's feature grid the table is built for: data.img_size "
                      "divided by its stride, e.g. [8, 8] for 64 px at stride 8",
         "detr.backbone_widths": "detr.backbone_widths=null leaves it unset",
         "model.pe_kwargs": "model.pe_kwargs={} replaces the settings the config file gives"}


#: ``detr.backbone_weights`` value that asks for a ResNet from random weights (train.py refuses a
#: ResNet without weights unless asked: DETR's recipes assume ImageNet weights)
RANDOM_WEIGHTS = "random"
#: torchvision's ImageNet files (the names DETR's and torchvision's docs use)
RESNET_FILES = {"resnet18": "resnet18-f37072fd.pth", "resnet34": "resnet34-b627a593.pth",
                "resnet50": "resnet50-0676ba61.pth", "resnet101": "resnet101-63fe2227.pth"}


class DetectionTask:
    """DETR on a COCO-format data set (module docstring)."""

    primary = "AP"
    sum_keys = (*LOSS_KEYS, "count")
    #: config keys only this task reads (another task refuses them when they are changed)
    own_keys = ("detr", "task.cost_class", "task.cost_bbox", "task.cost_giou", "task.weight_ce", "task.weight_bbox",
                "task.weight_giou", "task.eos_coef", "task.focal_alpha", "task.focal_gamma", "task.size_divisibility", "task.vis_images", "task.vis_score",
                "data.max_size", "optim.lr_backbone")

    def __init__(self, task_cfg: DictConfig):
        self.cfg = task_cfg
        self.criterion = None  # built with the model (it needs the number of classes)
        self.collate_fn = None
        self.info_ = None

    @classmethod
    def check_config(cls, cfg: DictConfig) -> None:
        from vispe.train.schema import ConfigError
        if cfg.model.name != "detr":
            raise ConfigError(f"config key model.name={cfg.model.name!r}: task.name='detection' trains model.name="
                              "'detr' (its settings are the detr.* keys)")
        for key in ("task.eos_coef", "task.vis_score"):
            v = OmegaConf.select(cfg, key)
            if not 0 < v <= 1:
                raise ConfigError(f"config key {key}={v!r}: expected a number in (0, 1]")
        if cfg.task.vis_images < 0 or (cfg.task.size_divisibility is not None and cfg.task.size_divisibility < 1):
            raise ConfigError(f"config keys task.vis_images={cfg.task.vis_images}, task.size_divisibility="
                              f"{cfg.task.size_divisibility}: expected vis_images >= 0 and size_divisibility >= 1 or null")

    #: the detr.* keys that ``label`` shows when they are not DETR's defaults
    LABEL_KEYS = ("detr.decoder", "detr.dec_pe", "detr.box_bias", "detr.query_relation", "detr.pe_at",
                  "detr.query_pos_at")

    @staticmethod
    def label(cfg: DictConfig) -> str:
        """The encoding, then the design where it is not DETR's own: ``sine (dab, boxrpb)``,
        ``sine (dab, dec_pe=rope_axial)``, ``sine (dab, boxrpb, relation)``, ``sine (pe_at=input)``,
        ``sincos2d (dfine)`` (``rtdetr`` with D-FINE's decoder); plain DETR is ``sine``."""
        d = cfg.detr
        pe_at = OmegaConf.to_container(d.pe_at) if OmegaConf.is_config(d.pe_at) else d.pe_at
        decoder = "dfine" if d.decoder == "rtdetr" and (d.decoder_kwargs or {}).get("dfine") is not None else d.decoder
        parts = [decoder if decoder not in ("detr", None) else None,
                 f"dec_pe={d.dec_pe}" if d.dec_pe is not None else None,
                 d.box_bias,
                 d.query_relation,
                 None if pe_at == "attn" else "pe_at=" + (",".join(f"{k}:{v}" for k, v in pe_at.items())
                                                          if isinstance(pe_at, dict) else str(pe_at)),
                 f"query_pos_at={d.query_pos_at}" if d.query_pos_at != "attn" else None]
        parts = [p for p in parts if p]
        return f"{cfg.model.pe} ({', '.join(parts)})" if parts else cfg.model.pe

    # --- data ----------------------------------------------------------------------------------------
    def info(self, cfg: DictConfig):
        from vispe.data.detection import detection_info

        self.info_ = detection_info(cfg.data.name, root=cfg.data.root, **cfg.data.kwargs)
        return self.info_

    def dataset(self, cfg: DictConfig, split: str, img_size: int | None = None):
        from vispe.data.detection import build_detection_dataset

        d = cfg.data
        return build_detection_dataset(d.name, "val" if split == "test" else split, root=d.root, img_size=img_size,
                                       max_size=d.max_size, train_augment=d.train_augment, seed=d.seed,
                                       download=d.download, **d.kwargs)

    # --- model and loss ----------------------------------------------------------------------------
    def model(self, cfg: DictConfig, info, img_size: int) -> torch.nn.Module:
        from vispe.data.detection import collate_detection
        from vispe.models.detr import HungarianMatcher, SetCriterion, create_detr
        from vispe.models.detr.vitdet import task as vit_task

        if cfg.detr.decoder == "rtdetr":  # issue 48: the real-time DETRs (vispe.train.detection_rtdetr)
            from vispe.train.detection_rtdetr import build_for_task
            rt, self.criterion = build_for_task(cfg, info.num_classes)
            self.collate_fn = partial(collate_detection, size_divisibility=cfg.task.size_divisibility or rt.stride)
            return rt
        t, m = cfg.task, OmegaConf.to_container(cfg.detr, resolve=True)
        check_encodings({"model.pe": cfg.model.pe, "detr.dec_pe": m["dec_pe"],
                         "detr.decoder_kwargs.anchor_pe": (m["decoder_kwargs"] or {}).get("anchor_pe")})
        if m["backbone_weights"] == RANDOM_WEIGHTS:  # asked for (check_config refuses a ResNet without weights)
            m["backbone_weights"] = None
        try:
            if m["decoder"] in vit_task.DECODERS:  # LW-DETR / RF-DETR: vispe.models.detr.vitdet (issue 49)
                model = vit_task.from_train_config(info.num_classes, cfg.model.pe, m, _detr_defaults())
            else:
                model = create_detr(info.num_classes, pe=cfg.model.pe, pe_kwargs=dict(cfg.model.pe_kwargs),
                                    **{k: (tuple(v) if k in ("grid", "backbone_widths") and v is not None else v)
                                       for k, v in m.items()})
        except (TypeError, ValueError) as e:  # worded by argument: name the config keys instead
            settings = {**({m["dec_pe"]: "detr.dec_pe_kwargs"} if m["dec_pe"] else {}), cfg.model.pe: "model.pe_kwargs"}
            raise ValueError(reword(str(e), {**{k: f"detr.{k}" for k in m}, **MODEL_KEYS}, settings, HINTS)) from e
        _check_backbone_weights(cfg)  # after the build, so that its option errors come first
        focal = dict(focal_alpha=t.focal_alpha, focal_gamma=t.focal_gamma) if model.class_head == "sigmoid" else {}
        matcher = HungarianMatcher(t.cost_class, t.cost_bbox, t.cost_giou, **focal)
        self.criterion = SetCriterion(info.num_classes, matcher, eos_coef=t.eos_coef, weight_ce=t.weight_ce,
                                      weight_bbox=t.weight_bbox, weight_giou=t.weight_giou, **focal)
        if hasattr(model, "wrap_criterion"):  # Group DETR: the loss per group of queries (vitdet)
            self.criterion = model.wrap_criterion(self.criterion)
        divisor = t.size_divisibility or getattr(model, "stride", None) or model.backbone.stride  # multi-scale: the backbone's coarsest
        self.collate_fn = partial(collate_detection, size_divisibility=divisor)
        return model

    def param_groups(self, model: torch.nn.Module, cfg: DictConfig) -> list[dict]:
        """DETR's two groups: the backbone at ``optim.lr_backbone`` (default ``optim.lr``), the rest at ``optim.lr``."""
        o = cfg.optim
        lr_backbone = o.lr_backbone if o.lr_backbone is not None else o.lr
        return model.param_groups(o.lr, lr_backbone, o.weight_decay)

    def _forward(self, model, batch, device):
        """(outputs, losses, sums) of one batch."""
        images, mask, targets = batch
        images = images.to(device, non_blocking=True)  # (B, 3, H, W)
        mask = mask.to(device, non_blocking=True)  # (B, H, W)
        # in training, a model that takes the targets gets them (DINO's denoising groups); eval never passes them
        out = model(images, mask, targets=targets) if model.training and _takes_targets(model) else model(images, mask)
        losses = self.criterion.to(device)(out, targets)
        n = images.shape[0]
        with torch.no_grad():
            sums = {k: losses[k].detach().double() * n for k in LOSS_KEYS}
            sums["count"] = torch.tensor(float(n), dtype=torch.float64, device=device)
        return out, losses, sums

    def step(self, model, batch, device, *, train: bool = True):
        _, losses, sums = self._forward(model, batch, device)
        return losses["loss"], sums

    def metrics(self, sums: dict) -> dict:
        n = max(float(sums["count"]), 1.0)
        return {k: float(sums[k]) / n for k in LOSS_KEYS}

    # --- evaluation --------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model, loader, *, device, amp_dtype, should_stop=lambda: False) -> dict:
        """Test losses and COCO AP of ``model`` on this process's share of the data, over all processes."""
        from vispe.data.coco_eval import coco_evaluate
        from vispe.models.detr import to_coco_results
        from vispe.train.distributed import all_reduce_sums
        from vispe.train.engine import Interrupted, add_sums, autocast

        model.eval()
        coco = _coco_of(loader.dataset)
        categories = set(coco.getCatIds())  # a class id that is no category (COCO's gaps, id 0) is not a detection
        sums, results, image_ids = {}, [], []
        for batch in loader:
            if should_stop():
                raise Interrupted
            with autocast(device, amp_dtype):
                out, _, batch_sums = self._forward(model, batch, device)
            add_sums(sums, batch_sums)
            results += [r for r in to_coco_results(out, batch[2]) if r["category_id"] in categories]
            image_ids += [int(t["image_id"]) for t in batch[2]]
        for k in self.sum_keys:  # an empty shard still takes part in the reduction
            sums.setdefault(k, torch.zeros((), dtype=torch.float64, device=device))
        metrics = self.metrics(all_reduce_sums(sums))
        results, image_ids = _gather(results), _gather(image_ids)
        return {**metrics, **absent_sizes(coco_evaluate(coco, results, img_ids=sorted(set(image_ids))))}

    @torch.no_grad()
    def visualize(self, model, dataset, path: str | Path, device) -> None:
        """True and predicted boxes on the first ``task.vis_images`` images, one PNG (``detection_vis``)."""
        from vispe.train.detection_vis import draw_predictions

        if self.cfg.vis_images:
            draw_predictions(model, dataset, path, device=device, collate_fn=self.collate_fn, info=self.info_,
                             n=self.cfg.vis_images, score=self.cfg.vis_score)


def _detr_defaults() -> dict:
    """The ``detr.*`` keys' defaults (the schema's)."""
    from vispe.train.schema import DetrModelConfig
    return OmegaConf.to_container(OmegaConf.structured(DetrModelConfig), resolve=True)


_SAID: set[str] = set()


def absent_sizes(scores: dict[str, float], say=print) -> dict[str, float]:
    """``scores`` without COCOeval's -1 entries (no ground truth of that size: the metric is undefined,
    not -1), saying once per process which were left out and why."""
    absent = sorted(k for k, v in scores.items() if v == -1.0)
    if absent and not set(absent) <= _SAID:
        _SAID.update(absent)
        say(f"COCO {', '.join(absent)}: no object of that size among the evaluated images (COCOeval's -1); "
            "left out of the logs, metrics.csv and curves.png rather than logged as a score")
    return {k: v for k, v in scores.items() if k not in absent}


def _check_backbone_weights(cfg: DictConfig) -> None:
    """A ResNet backbone needs ``detr.backbone_weights``: a file, or ``random`` when asked for."""
    from vispe.models.detr.backbone.cnn import RESNETS

    if cfg.detr.backbone in RESNETS and cfg.detr.backbone_weights is None:
        raise ValueError(
            f"detr.backbone={cfg.detr.backbone!r} without detr.backbone_weights: the ResNet would start from "
            "random weights, and DETR's recipes start from ImageNet ones. Give a local ImageNet state_dict "
            "(torchvision's or timm's; nothing is downloaded), e.g. detr.backbone_weights=/path/to/"
            f"{RESNET_FILES[cfg.detr.backbone]}, or detr.backbone_weights={RANDOM_WEIGHTS} to train it from "
            "random weights on purpose")


def _gather(items: list) -> list:
    """The concatenation of ``items`` over every process (a plain copy with one process)."""
    if not (dist.is_available() and dist.is_initialized()):
        return list(items)
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, items)
    return [x for part in parts for x in part]


def _coco_of(dataset):
    """The pycocotools COCO of a detection data set, through Subset / SeededSamples wrappers."""
    while not hasattr(dataset, "coco"):
        if not hasattr(dataset, "dataset"):
            raise ValueError(f"{type(dataset).__name__} has no .coco: expected a vispe detection data set")
        dataset = dataset.dataset
    return dataset.coco


def _takes_targets(model) -> bool:
    """Whether ``model``'s forward (under a DDP or torch.compile wrapper) takes ``targets``."""
    import inspect

    inner = getattr(model, "module", model)  # DistributedDataParallel
    inner = getattr(inner, "_orig_mod", inner)  # torch.compile
    return "targets" in inspect.signature(inner.forward).parameters
