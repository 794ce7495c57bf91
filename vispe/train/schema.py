"""The training configuration's schema: typed dataclasses, one per section, and their choices.

``vispe.train.config`` loads YAML files and overrides into it and checks them; every valid key is
a field here (``schema_keys``). The task, the data set and the model are named by strings
(``task.name``, ``data.name``, ``model.name`` / ``model.pe``), so a second task (detection) adds
fields, not a second schema.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

DEVICES = ("auto", "cpu", "cuda")
AMPS = ("auto", "bf16", "fp16", "none")
SCHEDULES = ("cosine", "constant", "step")
OPTIMIZERS = ("adamw", "sgd")
#: keys that may change when a run is resumed (they do not change what is being trained)
RESUMABLE_KEYS = ("train.epochs", "train.device", "train.threads", "train.compile", "train.log_every", "train.progress",
                  "train.ckpt_every_steps", "train.eval_every", "task.vis_images", "task.vis_score", "train.compare", "train.overwrite", "data.num_workers",
                  "data.eval_batch_size", "smoke")


class ConfigError(ValueError):
    """A bad configuration key or value; the message says which and what was expected."""


@dataclass
class TaskConfig:
    name: str = "classification"  # key of vispe.train.tasks.TASKS
    label_smoothing: float = 0.0  # classification only
    # detection only (DETR's matcher costs, loss weights and no-object weight)
    cost_class: float = 1.0
    cost_bbox: float = 5.0
    cost_giou: float = 2.0
    weight_ce: float = 1.0
    weight_bbox: float = 5.0
    weight_giou: float = 2.0
    eos_coef: float = 0.1  # softmax class heads only
    focal_alpha: float = 0.25  # sigmoid class heads (detr.class_head, the positioned designs): focal loss and cost
    focal_gamma: float = 2.0
    size_divisibility: Optional[int] = None  # pad batches to a multiple of this; None = the backbone's stride
    vis_images: int = 6  # validation images drawn with predicted and true boxes at each evaluation (0 = none)
    vis_score: float = 0.5  # predictions drawn above this score


@dataclass
class DataConfig:
    name: str = "digits_cell"  # a name known to vispe.data.build_dataset
    root: Optional[str] = None  # folder of on-disk data sets (cifar10); None for embedded ones
    download: bool = False
    img_size: Optional[int] = None  # training size; None = the data set's native size
    seed: int = 0  # seed of generated (embedded) data sets
    train_augment: Any = None  # None = the data set's default; true / false; detection also "square" (resize to img_size x img_size, no flip)
    kwargs: Dict[str, Any] = field(default_factory=dict)  # extra build_dataset arguments
    batch_size: int = 128  # per process
    eval_batch_size: Optional[int] = None  # None = 2 * batch_size
    num_workers: int = 0
    max_size: Optional[int] = None  # detection: cap of the longer side; None = the data set's default
    train_subset: Optional[int] = None  # use only the first n training samples (smoke runs)
    test_subset: Optional[int] = None


@dataclass
class ModelConfig:
    name: str = "vit_tiny"  # vispe preset or timm model name, for vispe.models.vit.create_vit
    pe: str = "learned_abs"  # encoding name from vispe.available()
    pe_kwargs: Dict[str, Any] = field(default_factory=dict)  # for `pe` only, not for the baselines
    patch_size: int = 4
    # None leaves the preset's value; any other timm argument goes in `kwargs`
    embed_dim: Optional[int] = None
    depth: Optional[int] = None
    num_heads: Optional[int] = None
    mlp_ratio: Optional[float] = None
    class_token: Optional[bool] = None
    global_pool: Optional[str] = None
    reg_tokens: Optional[int] = None
    drop_path_rate: Optional[float] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class DetrModelConfig:
    """The detector of task.name=detection (model.name=detr): vispe.models.detr.create_detr's arguments."""

    backbone: str = "small_cnn"  # small_cnn | resnet18 | resnet34 | resnet50 | resnet101 | a vispe ViT preset
    backbone_kwargs: Dict[str, Any] = field(default_factory=dict)  # ViT presets: create_vit's arguments + layers
    backbone_mask_aware: bool = False  # ResNets: zero the padding after every norm (no leak; not DETR's)
    backbone_weights: Optional[str] = None  # local ResNet state_dict (nothing downloads); "random": from scratch, asked
    backbone_widths: Optional[List[int]] = None  # small_cnn channels per stage
    dilation: bool = False
    train_backbone: bool = True
    num_queries: Optional[int] = None  # None: the attention's paper (dense: DETR's 100, deformable: 300)
    d_model: int = 256
    nheads: int = 8
    enc_layers: int = 6
    dec_layers: int = 6
    dim_feedforward: Optional[int] = None  # None: the attention's paper (dense: DETR's 2048, deformable: 1024)
    dropout: float = 0.1
    pe_at: Any = "attn"  # none | input | attn, or {encoder: ..., decoder: ..., queries: ...}
    query_pos_at: str = "attn"
    dec_pe: Optional[str] = None  # an additive encoding for the decoder's keys (None = the encoder's)
    dec_pe_kwargs: Dict[str, Any] = field(default_factory=dict)
    grid: Optional[List[int]] = None  # feature grid of encodings with grid-sized tables
    aux_loss: bool = True
    decoder: Optional[str] = None  # detr | conditional | dab | deformable (None: detr, deformable with attention=deformable)
    decoder_kwargs: Dict[str, Any] = field(default_factory=dict)  # the design's options (e.g. query_dim, modulate_hw)
    box_bias: Optional[str] = None  # boxrpb: Plain-DETR's box-to-pixel bias in cross-attention (decoder=dab)
    box_bias_kwargs: Dict[str, Any] = field(default_factory=dict)  # hidden, transform (linear | abs_log8), stride
    query_relation: Optional[str] = None  # relation: Relation-DETR's box-to-box bias in self-attention (decoder=dab)
    query_relation_kwargs: Dict[str, Any] = field(default_factory=dict)  # num_feats, temperature, scale
    class_head: Optional[str] = None  # softmax (K+1, cross-entropy) | sigmoid (K, focal loss); None = the design's
    activation: str = "relu"  # the transformer FFNs': relu | prelu (DAB-DETR) | gelu
    init: str = "papers"  # papers (Conditional/DAB-DETR's code) | legacy (vispe's before issue 35)
    attention: str = "dense"  # dense | deformable (multi-scale Deformable DETR; decoder=deformable | dab)
    num_feature_levels: Optional[int] = None  # deformable: levels (None = 4)
    n_points: Any = None  # deformable: sampling points per head and level, or [encoder, decoder] (None = 4)
    level_pe: Optional[str] = None  # deformable: learned | none, the level embedding (None = learned)
    backbone_levels: Optional[int] = None  # deformable: levels from the backbone, the rest extra convs (None = min(L, 3))


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 1e-3  # peak learning rate
    weight_decay: float = 0.05
    momentum: float = 0.9  # sgd only
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # adamw only
    warmup_epochs: float = 1.0
    schedule: str = "cosine"  # cosine | constant | step (after warm-up; step: x0.1 at epoch lr_drop)
    lr_drop: Optional[float] = None  # epoch of the step schedule's x0.1 drop (DETR: 200 of 300)
    lr_backbone: Optional[float] = None  # detection: the backbone's learning rate (DETR: 1e-5); None = lr
    min_lr: float = 1e-5
    grad_clip: Optional[float] = 1.0  # max gradient norm; None = off


@dataclass
class TrainLoopConfig:
    epochs: int = 10
    seed: int = 0
    device: str = "auto"  # auto (CUDA when present) | cpu | cuda
    amp: str = "auto"  # auto (bf16 on CUDA, none on CPU) | bf16 | fp16 | none
    # CPU threads of torch; 0 = auto: one per core when OMP_WAIT_POLICY=PASSIVE (train.py sets it), else 1
    # (vispe/train/threads.py; on a machine shared with other jobs see docs/training.md)
    threads: int = 0
    compile: bool = False  # torch.compile the model
    # CPU runs are reproducible either way (tests/test_train_resume.py); true also asks for deterministic
    # GPU kernels (slower; set CUBLAS_WORKSPACE_CONFIG=:4096:8 before starting)
    deterministic: bool = False
    eval_sizes: List[float] = field(default_factory=lambda: [0.75, 1.0, 1.5, 2.0])  # x training size
    eval_every: int = 1  # epochs between test evaluations (always after the last epoch)
    compare: List[str] = field(default_factory=list)  # encodings also trained as baselines
    log_every: int = 20  # steps between TensorBoard loss points
    ckpt_every_steps: int = 0  # 0 = checkpoint at the end of every epoch only
    progress: bool = True  # tqdm bar on a terminal, a plain line every 30 s in a log (vispe.train.progress)
    out_dir: str = "runs"
    run_name: Optional[str] = None  # None = the config file's name (+ "_smoke")
    overwrite: bool = False  # move a finished run folder aside (<name>.bak-<time>) and start again


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    detr: DetrModelConfig = field(default_factory=DetrModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    smoke: List[str] = field(default_factory=list)  # overrides applied by `train.py --smoke`


FREE_DICTS = ("data.kwargs", "model.pe_kwargs", "model.kwargs", "detr.dec_pe_kwargs", "detr.pe_at", "detr.decoder_kwargs",
              "detr.box_bias_kwargs", "detr.query_relation_kwargs", "detr.backbone_kwargs")


def schema_keys(cls=Config, prefix: str = "") -> list[str]:
    """Every valid dotted key of the schema: ``["task.name", ..., "train.overwrite", ...]``."""
    keys = []
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(sub):
            keys += schema_keys(sub, key + ".")
        else:
            keys.append(key)
    return keys
