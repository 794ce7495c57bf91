"""Training configuration: YAML files and checked command-line overrides over the typed schema
(``vispe.train.schema``).

    cfg = load_config("configs/cifar10_vit.yaml", ["model.pe=rope_mixed", "train.epochs=100"])

Order of precedence (later wins): the schema's dataclass defaults, the YAML file, the file's ``smoke``
overrides (only with ``smoke=True``), then the command-line overrides ``key.sub=value``. Every key
is checked against the schema: a misspelt key is refused with the nearest valid keys, a value of
the wrong type with the key, the value and the expected type (OmegaConf structured configs do the
type conversion; this module words the errors). Free-form dictionaries (``data.kwargs``,
``model.pe_kwargs``, ``model.kwargs``, ``detr.backbone_kwargs``) accept any sub-key and pass it to the builder, which
refuses what it does not know.

The task, the data set and the model are named by strings (``task.name``, ``data.name``,
``model.name`` / ``model.pe``), so a second task (detection) adds fields, not a second schema.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from vispe.train.schema import (  # noqa: F401  (re-exported: the public names of the config)
    AMPS,
    DEVICES,
    FREE_DICTS,
    OPTIMIZERS,
    RESUMABLE_KEYS,
    SCHEDULES,
    Config,
    ConfigError,
    DataConfig,
    DetrModelConfig,
    ModelConfig,
    OptimConfig,
    TaskConfig,
    TrainLoopConfig,
    schema_keys,
)


def _field_type(key: str) -> str:
    cls, parts = Config, key.split(".")
    for p in parts:
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if p not in fields:
            return "a value of the type of the schema's field"
        f = fields[p]
        cls = f.default_factory if dataclasses.is_dataclass(f.default_factory) else f.type
    if dataclasses.is_dataclass(cls):
        return f"a section of keys ({key}.*), not a value"
    return str(cls).replace("typing.", "")


def _check_key(key: str, where: str) -> None:
    """Refuse a dotted key that is not in the schema (sub-keys of the free dictionaries pass)."""
    valid = schema_keys()
    if key in valid or any(key.startswith(d + ".") for d in FREE_DICTS):
        return
    if any(v.startswith(key + ".") for v in valid):  # a whole section, e.g. `model:` in a YAML file
        return
    near = difflib.get_close_matches(key, valid, n=3, cutoff=0.5)
    if not near:  # the last part may be right under another section, or the section may be right
        last = key.rsplit(".", 1)[-1]
        near = [v for v in valid if v.rsplit(".", 1)[-1] == last] or \
               [v for v in valid if v.startswith(key.split(".")[0] + ".")][:6]
    hint = f"; nearest valid keys: {', '.join(near)}" if near else ""
    raise ConfigError(f"unknown config key {key!r} in {where}{hint}")


def _flat_keys(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key not in FREE_DICTS and key not in ("smoke",):
            out += _flat_keys(v, key + ".") if v else [key]
        else:
            out.append(key)
    return out


def _merge(cfg: DictConfig, other: DictConfig, where: str) -> DictConfig:
    for key in _flat_keys(OmegaConf.to_container(other)):
        _check_key(key, where)
    try:
        return OmegaConf.merge(cfg, other)
    except ConfigKeyError as e:  # should have been caught above; keep the message useful anyway
        raise ConfigError(f"unknown config key {e.full_key!r} in {where}") from None
    except OmegaConfBaseException as e:
        key = str(e.full_key) if e.full_key else _culprit(cfg, other)
        value = OmegaConf.select(other, key.split("[")[0], default="?")
        if "[" in key and (isinstance(value, (list, tuple)) or OmegaConf.is_list(value)):  # one list item
            value = list(value)[int(key.split("[")[1].rstrip("]"))]
        msg = str(e).splitlines()[0]
        field = key.split("[")[0]
        ftype = _field_type(field)
        if ftype.startswith("List") and "[" not in key and not (
                isinstance(value, (list, tuple)) or OmegaConf.is_list(value)):
            raise ConfigError(f"config key {key}={value!r} in {where}: expected {ftype}, a list in brackets: "
                              f"{key}=[{value}] for one item, {key}=[a,b] for two, {key}=[] for none") from None
        raise ConfigError(f"config key {key}={value!r} in {where}: expected "
                          f"{_field_type(key.split('[')[0])} ({msg})") from None


def _culprit(cfg: DictConfig, other: DictConfig) -> str:
    """The first key of ``other`` that does not merge into ``cfg`` alone (when OmegaConf names none)."""
    flat = other if isinstance(other, dict) else OmegaConf.to_container(other)
    for key in _flat_keys(flat):
        one = OmegaConf.create()
        OmegaConf.update(one, key, OmegaConf.select(other, key), force_add=True)
        try:
            OmegaConf.merge(cfg, one)
        except OmegaConfBaseException:
            return key
    return "?"


def parse_overrides(overrides: list[str], where: str = "command line") -> DictConfig:
    """``["a.b=1", ...]`` -> a DictConfig; each item must be ``key=value``."""
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} in {where}: expected key=value, e.g. train.epochs=5")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as e:
        raise ConfigError(f"override in {where} could not be parsed: {str(e).splitlines()[0]}") from None


def load_config(path: str | Path | None = None, overrides: list[str] = (), *, smoke: bool = False) -> DictConfig:
    """Defaults <- YAML file <- its ``smoke`` list (if ``smoke``) <- ``overrides``; checked."""
    cfg = OmegaConf.structured(Config)
    stem = "default"
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            loaded = OmegaConf.load(path)
        except Exception as e:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from None
        if not isinstance(loaded, DictConfig):
            raise ConfigError(f"config file {str(path)!r}: expected a mapping of sections at the top")
        cfg = _merge(cfg, loaded, str(path))
        stem = path.stem if path.name != "config.yaml" else path.parent.name  # a run's resolved config
    if smoke:
        if not cfg.smoke:
            raise ConfigError(f"--smoke: the config {str(path)!r} has no `smoke` list of overrides")
        cfg = _merge(cfg, parse_overrides(list(cfg.smoke), "the smoke list"), "the smoke list")
    cfg = _merge(_replaced_dicts(cfg, overrides), parse_overrides(list(overrides)), "command line")
    if cfg.train.run_name is None:
        cfg.train.run_name = stem + ("_smoke" if smoke else "")
    validate(cfg)
    return cfg


def _replaced_dicts(cfg: DictConfig, overrides) -> DictConfig:
    """``cfg`` with the free dictionaries that ``overrides`` set whole (``model.pe_kwargs={}`` or
    ``model.pe_kwargs={temperature: 20}``) emptied first: such an override replaces the dictionary of
    the file instead of adding to it (``model.pe_kwargs.temperature=20`` still adds one key)."""
    pairs = [item.split("=", 1) for item in overrides if "=" in item]
    whole = [k.strip() for k, v in pairs if k.strip() in FREE_DICTS and v.strip().startswith("{")]
    if not whole:
        return cfg
    cfg = copy.deepcopy(cfg)
    for key in whole:
        OmegaConf.update(cfg, key, {}, merge=False)
    return cfg


def _choice(key: str, value, choices) -> None:
    if value not in choices:
        raise ConfigError(f"config key {key}={value!r}: expected one of {', '.join(map(repr, choices))}")


def _positive(key: str, value, allow_zero: bool = False) -> None:
    if value is not None and not (value >= 0 if allow_zero else value > 0):
        raise ConfigError(f"config key {key}={value!r}: expected a {'non-negative' if allow_zero else 'positive'} number")


def validate(cfg: DictConfig) -> None:
    """Value checks that types cannot express (choices, ranges); names are checked by the builders."""
    from vispe.train.tasks import TASKS

    _choice("task.name", cfg.task.name, tuple(TASKS))
    for other, cls in TASKS.items():  # a key only another task reads, changed, would be ignored
        if other != cfg.task.name:
            refuse_unused(cfg, cls.own_keys, f"a {other} setting, unused by task.name={cfg.task.name!r}")
    TASKS[cfg.task.name].check_config(cfg)
    _choice("train.device", cfg.train.device, DEVICES)
    _choice("train.amp", cfg.train.amp, AMPS)
    _choice("optim.schedule", cfg.optim.schedule, SCHEDULES)
    _choice("optim.name", cfg.optim.name, OPTIMIZERS)
    for key in ("data.batch_size", "data.eval_batch_size", "data.img_size", "data.train_subset",
                "data.test_subset", "model.patch_size", "optim.lr", "train.epochs", "train.log_every",
                "train.eval_every", "optim.lr_backbone", "optim.lr_drop"):
        _positive(key, OmegaConf.select(cfg, key))
    for key in ("data.num_workers", "train.threads", "train.ckpt_every_steps", "optim.weight_decay", "optim.warmup_epochs",
                "optim.min_lr", "task.label_smoothing"):
        _positive(key, OmegaConf.select(cfg, key), allow_zero=True)
    _positive("optim.grad_clip", cfg.optim.grad_clip)
    if (cfg.optim.schedule == "step") != (cfg.optim.lr_drop is not None):
        raise ConfigError(f"config keys optim.schedule={cfg.optim.schedule!r} and optim.lr_drop={cfg.optim.lr_drop!r}: "
                          "the step schedule needs lr_drop (the epoch of its x0.1 drop), and only it takes one")
    if not cfg.train.eval_sizes or any(s <= 0 for s in cfg.train.eval_sizes):
        raise ConfigError(f"config key train.eval_sizes={list(cfg.train.eval_sizes)}: expected a non-empty "
                          "list of positive scale factors of the training size, e.g. [0.75, 1.0, 1.5, 2.0]")
    if len(cfg.optim.betas) != 2:
        raise ConfigError(f"config key optim.betas={list(cfg.optim.betas)}: expected two numbers")
    name = cfg.train.run_name
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ConfigError(f"config key train.run_name={name!r}: expected a folder name (no slashes)")


def non_default(cfg: DictConfig, keys) -> list[str]:
    """The dotted ``keys`` (or every key under a section name) whose value differs from the schema's default."""
    default = _flatten(OmegaConf.to_container(OmegaConf.structured(Config), resolve=True))
    current = _flatten(OmegaConf.to_container(cfg, resolve=True))
    return [k for k in sorted(current) if any(k == p or k.startswith(p + ".") for p in keys)
            and current[k] != default.get(k)]


def refuse_unused(cfg: DictConfig, keys, why: str) -> None:
    """A ConfigError naming the first of ``keys`` set away from its default (an option that would be ignored)."""
    bad = non_default(cfg, keys)
    if bad:
        value = OmegaConf.select(cfg, bad[0])
        raise ConfigError(f"config key {bad[0]}={value!r}: {why}")


def for_encoding(cfg: DictConfig, pe: str) -> DictConfig:
    """The config of one encoding's run: ``pe`` set, no baselines; ``pe_kwargs`` kept only for the main pe."""
    sub = copy.deepcopy(cfg)
    if pe != cfg.model.pe:
        sub.model.pe_kwargs = {}
    sub.model.pe = pe
    sub.train.compare = []
    return sub


def encodings(cfg: DictConfig) -> list[str]:
    """The main encoding first, then the baselines of ``train.compare`` (duplicates dropped)."""
    out = [cfg.model.pe]
    for pe in cfg.train.compare:
        if pe not in out:
            out.append(pe)
    return out


def diff(old: DictConfig, new: DictConfig) -> dict[str, tuple]:
    """Dotted keys whose values differ between two configs: ``{key: (old, new)}``."""
    a = _flatten(OmegaConf.to_container(old, resolve=True))
    b = _flatten(OmegaConf.to_container(new, resolve=True))
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and f"{prefix}{k}" not in FREE_DICTS:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
