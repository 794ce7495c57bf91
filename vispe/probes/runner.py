"""The padding-leakage experiment: backbone x padding x input x target -> SPC / MAE, as a tidy CSV.

For every (backbone, padding, input kind, seed) the backbone (random init, frozen) is built, its
maps are computed on ``n_train`` training and ``n_test`` test inputs, and read-out probes
(``readout.fit_probe``) are trained for all targets at once and scored on the test inputs.
CNNs are probed on all their stages concatenated (``level="all"``); ViTs on each block
(``level="0"``, ``"1"``, ...). One CSV row per (configuration, target, level).

    python -m vispe.probes.runner --out results/padding_leakage.csv            # the default sweep
    python -m vispe.probes.runner --backbones vgg --paddings zeros circular --inputs constant
    python -m vispe.probes.runner --backbones --vits none sine peg:zeros peg:circular

Backbones are never trained here (``backbone_init="random"`` in every row): the read-out measures
what the architecture alone lets through, as in the paper's randomisation experiments.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from vispe import _checks
from vispe.probes.backbones import BACKBONES, PADDINGS, build_backbone
from vispe.probes.inputs import INPUTS, make_inputs
from vispe.probes.readout import ProbeSettings, evaluate_probe, fit_probe, stack_features
from vispe.probes.targets import TARGETS, target_stack
from vispe.probes.vit_backbone import VIT_ENCODINGS, build_vit_backbone, parse_vit_spec


@dataclass
class ExperimentConfig:
    """What to sweep and how big. The defaults run in a few minutes on 2 CPU cores."""

    backbones: tuple[str, ...] = BACKBONES
    paddings: tuple[str, ...] = PADDINGS
    vits: tuple[str, ...] = ()  # ViT encodings '<pe>' or '<pe>:<padding>' (VIT_ENCODINGS); `paddings` is for CNNs
    inputs: tuple[str, ...] = INPUTS
    targets: tuple[str, ...] = TARGETS
    seeds: tuple[int, ...] = (0,)
    image_size: int = 64
    probe_size: int = 16  # targets and resized features are probe_size x probe_size
    n_train: int = 32
    n_test: int = 64
    vit_patch_size: int = 8
    vit_preset: str = "vit_pico"
    probe: ProbeSettings = field(default_factory=ProbeSettings)

    def __post_init__(self) -> None:
        for b in self.backbones:
            _checks.choice("backbones", b, BACKBONES)
        for p in self.paddings:
            _checks.choice("paddings", p, PADDINGS)
        for i in self.inputs:
            _checks.choice("inputs", i, INPUTS)
        for t in self.targets:
            _checks.choice("targets", t, TARGETS)
        for spec in self.vits:
            parse_vit_spec(spec)
        for name in ("inputs", "targets", "seeds"):
            if not getattr(self, name):
                raise ValueError(f"{name}=(): expected at least one")
        if not isinstance(self.probe, ProbeSettings):
            raise ValueError(f"probe={self.probe!r}: expected a ProbeSettings")
        for name in ("image_size", "probe_size", "n_train", "n_test", "vit_patch_size"):
            _checks.positive_int(name, getattr(self, name))
        if self.backbones and not self.paddings:
            raise ValueError("paddings=(): expected at least one padding for the CNN backbones")
        if not (self.backbones or self.vits):
            raise ValueError("backbones=() and vits=(): expected at least one backbone")


#: named sizes: "small" is the default sweep (minutes on 2 cores), "tiny" a seconds-long smoke run
SCALES = {
    "small": {},
    "tiny": dict(backbones=("vgg",), paddings=("zeros", "circular"), inputs=("constant", "natural"),
                 targets=("H", "G"), image_size=32, probe_size=8, n_train=2, n_test=2,
                 probe=ProbeSettings(steps=5)),
}


def config_for(scale: str = "small", **overrides) -> ExperimentConfig:
    """The ``ExperimentConfig`` of a named scale (``SCALES``), with ``overrides`` applied."""
    _checks.choice("scale", scale, tuple(SCALES))
    return ExperimentConfig(**{**SCALES[scale], **overrides})


@dataclass
class ProbeResult:
    """The read-out of one backbone level on one input kind, for all targets."""

    level: str
    spc: torch.Tensor  # (T,) mean over test images
    mae: torch.Tensor  # (T,)
    flat: torch.Tensor  # (T,) fraction of test images with a flat prediction (SPC counted 0)
    pred: torch.Tensor  # (T, h', w') prediction on the first test image (h' = h - k + 1, valid read-out)
    targets: torch.Tensor  # (T, h', w') the targets where the prediction is scored
    image: torch.Tensor  # (3, H, W) the first test image


@torch.no_grad()
def _maps(model: nn.Module, x: torch.Tensor, batch: int = 16) -> list[torch.Tensor]:
    chunks = [model(x[i:i + batch]) for i in range(0, x.shape[0], batch)]
    return [torch.cat(level) for level in zip(*chunks)]  # [(N, C_i, h_i, w_i)]


def probe_model(model: nn.Module, input_kind: str, cfg: ExperimentConfig, *, seed: int = 0,
                per_level: bool = False) -> list[ProbeResult]:
    """Train and score probes on ``model``'s maps for ``input_kind``: one on all levels, or one per level."""
    size = (cfg.image_size, cfg.image_size)
    x_train = make_inputs(input_kind, cfg.n_train, size, split="train", seed=seed)  # (N, 3, H, W)
    x_test = make_inputs(input_kind, cfg.n_test, size, split="test", seed=seed)
    train, test = _maps(model, x_train), _maps(model, x_test)
    targets = target_stack(cfg.targets, (cfg.probe_size, cfg.probe_size))  # (T, h, w)
    groups = [(str(i), [i]) for i in range(len(train))] if per_level else [("all", list(range(len(train))))]
    results = []
    for level, idx in groups:
        f_train, scales = stack_features([train[i] for i in idx], targets.shape[-2:])
        f_test, _ = stack_features([test[i] for i in idx], targets.shape[-2:], scales)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            probe, _ = fit_probe(f_train, targets, cfg.probe)
        r = evaluate_probe(probe, f_test, targets)
        results.append(ProbeResult(level, r["spc"], r["mae"], r["flat"], r["pred"][0], r["targets"], x_test[0]))
    return results


def probe_backbone(backbone: str, padding: str, input_kind: str, cfg: ExperimentConfig | None = None,
                   *, seed: int = 0) -> ProbeResult:
    """One CNN configuration probed on all its stages (for plots of predictions next to targets)."""
    cfg = cfg or ExperimentConfig()
    return probe_model(build_backbone(backbone, padding, seed=seed), input_kind, cfg, seed=seed)[0]


def _models(cfg: ExperimentConfig, seed: int):
    """(backbone, encoding, padding, model factory, per_level) for every backbone of the sweep."""
    for b in cfg.backbones:
        for p in cfg.paddings:
            yield b, "-", p, (lambda b=b, p=p: build_backbone(b, p, seed=seed)), False
    for spec in cfg.vits:
        yield "vit", spec.partition(":")[0], spec.partition(":")[2] or "-", (
            lambda spec=spec: build_vit_backbone(spec, image_size=cfg.image_size, patch_size=cfg.vit_patch_size,
                                                 preset=cfg.vit_preset, seed=seed)), True


def notebook_log(message: str) -> None:
    """``run_experiment``'s ``log`` in a notebook: the line in the cell's output, and on the kernel's
    own stderr, which is the terminal of ``python -m jupyter execute`` (it shows no cell output while
    it runs)."""
    print(message, flush=True)
    if sys.__stderr__ is not None and sys.__stderr__ is not sys.stderr:
        print(message, file=sys.__stderr__, flush=True)


def provenance() -> dict:
    """commit, device, threads, torch and date of this process's probes: the columns every results CSV has."""
    from vispe.sweep.provenance import cpu_model, git_commit

    return {"commit": git_commit(), "device": f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads",
            "threads": torch.get_num_threads(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "date_from": "run"}


def run_experiment(cfg: ExperimentConfig | None = None, out_csv=None, log=print) -> pd.DataFrame:
    """Run the sweep of ``cfg``; return (and write to ``out_csv`` if given) the tidy table. ``log``
    (None: silent) gets one line per probe, ``[k/n]`` first: how far the sweep is."""
    cfg = cfg or ExperimentConfig()
    rows = []
    total, done = len(cfg.seeds) * sum(1 for _ in _models(cfg, 0)) * len(cfg.inputs), 0
    for seed in cfg.seeds:
        for backbone, encoding, padding, factory, per_level in _models(cfg, seed):
            model = factory()
            for kind in cfg.inputs:
                t0 = time.perf_counter()
                results = probe_model(model, kind, cfg, seed=seed, per_level=per_level)
                seconds = time.perf_counter() - t0
                for r in results:
                    for t, target in enumerate(cfg.targets):
                        rows.append(dict(
                            backbone=backbone, encoding=encoding, padding=padding, input=kind, target=target,
                            level=r.level, seed=seed, spc=float(r.spc[t]), mae=float(r.mae[t]),
                            spc_flat=float(r.flat[t]), stages_used=getattr(model, "stages_used", None),
                            backbone_init="random", image_size=cfg.image_size, probe_size=cfg.probe_size,
                            n_train=cfg.n_train, n_test=cfg.n_test, **cfg.probe.as_row(),
                            seconds=round(seconds, 2)))
                done += 1
                if log:
                    spc = " ".join(f"{t}={v:+.2f}" for t, v in zip(cfg.targets, results[-1].spc.tolist()))
                    log(f"[{done}/{total}] {backbone:8s} {encoding:10s} {padding:9s} {kind:8s} seed={seed} "
                        f"{seconds:5.1f}s  SPC {spc}")
    df = pd.DataFrame(rows)
    df = df.assign(**provenance())  # every row says where it came from (issue 53)
    if out_csv is not None:
        Path(out_csv).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out_csv, index=False, float_format="%.4f")
    return df


def summary(df: pd.DataFrame, by=("backbone", "encoding", "padding", "input")) -> pd.DataFrame:
    """Mean SPC and MAE over targets (and seeds, levels) per group, as a wide table."""
    return df.groupby(list(by), sort=False)[["spc", "mae"]].mean().round(3)


def _parser() -> argparse.ArgumentParser:
    d = ExperimentConfig()
    p = argparse.ArgumentParser(prog="python -m vispe.probes.runner", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backbones", nargs="*", default=list(d.backbones), choices=BACKBONES)
    p.add_argument("--paddings", nargs="+", default=list(d.paddings), choices=PADDINGS)
    p.add_argument("--vits", nargs="*", default=[], help=f"ViT encodings, e.g. {' '.join(VIT_ENCODINGS)}")
    p.add_argument("--inputs", nargs="+", default=list(d.inputs), choices=INPUTS)
    p.add_argument("--targets", nargs="+", default=list(d.targets), choices=TARGETS)
    p.add_argument("--seeds", nargs="+", type=int, default=list(d.seeds))
    for name in ("image_size", "probe_size", "n_train", "n_test", "vit_patch_size"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    p.add_argument("--vit-preset", default=d.vit_preset)
    p.add_argument("--kernel-size", type=int, default=d.probe.kernel_size, choices=(1, 3))
    p.add_argument("--readout-padding", default=d.probe.readout_padding)
    p.add_argument("--steps", type=int, default=d.probe.steps, help="L-BFGS iterations of the probe")
    p.add_argument("--weight-decay", type=float, default=d.probe.weight_decay)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--out", default="results/padding_leakage.csv")
    return p


def main(argv=None) -> pd.DataFrame:
    a = _parser().parse_args(argv)
    torch.set_num_threads(_checks.positive_int("threads", a.threads))
    probe = ProbeSettings(kernel_size=a.kernel_size, readout_padding=a.readout_padding, steps=a.steps,
                          weight_decay=a.weight_decay)
    cfg = ExperimentConfig(backbones=tuple(a.backbones), paddings=tuple(a.paddings), vits=tuple(a.vits),
                           inputs=tuple(a.inputs), targets=tuple(a.targets), seeds=tuple(a.seeds),
                           image_size=a.image_size, probe_size=a.probe_size, n_train=a.n_train, n_test=a.n_test,
                           vit_patch_size=a.vit_patch_size, vit_preset=a.vit_preset, probe=probe)
    t0 = time.perf_counter()
    df = run_experiment(cfg, out_csv=a.out)
    print(summary(df).to_string())
    print(f"{len(df)} rows -> {a.out} in {time.perf_counter() - t0:.0f} s")
    return df


if __name__ == "__main__":
    main()
