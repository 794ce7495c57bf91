"""Parity of vispe's converted vision towers (``convert_vit``, ``vispe.models.towers``) against the
reference library, every parameter redrawn: the largest absolute difference of each output field
on each input, and the largest output for scale. One entry per tower in ``TOWERS``.

    flock /work/heavy.lock .venv/bin/python results/compare/parity_towers.py > results/compare/parity_towers.md
    .venv/bin/python results/compare/parity_towers.py --sizes tiny --only pixtral   # the tests' small configs

No download: each model is built from a config with random weights, at the released model's size
(``full``) or a tiny one (``tiny``, what ``tests/test_towers.py`` runs). Adding a tower is one
``Entry``: its name, a builder ``build(size) -> model`` and ``cases(model, size, g) -> [Case]`` (the inputs,
in the original's call, with a label); ``fields`` are the output fields compared.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's vispe

from vispe.models.vit import convert_vit  # noqa: E402

SIZES = ("tiny", "full")


class Case(NamedTuple):
    label: str  # what the input is, for the table
    args: tuple
    kwargs: dict = {}


class Entry(NamedTuple):
    name: str  # short key (--only)
    title: str  # the reference class, for the table
    build: Callable[[str], torch.nn.Module]  # size -> the original, random weights
    cases: Callable[[torch.nn.Module, str, torch.Generator], list]  # (original, size, generator) -> [Case]
    fields: tuple = ("last_hidden_state",)


def redraw(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter redrawn: norm weights in [0.5, 1.5], matrices N(0, 1/fan_in), the rest N(0, 0.2^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif p.dim() >= 2 and "embedding" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


# --- Qwen2-VL / Qwen2.5-VL: packed patches (T, C*t*p*p) and grid_thw ------------------------------
def _qwen_cases(grids: dict) -> Callable:
    def cases(model, size: str, g: torch.Generator) -> list:
        cfg, out = model.config, []
        for label, thw in grids[size]:
            thw = torch.tensor(thw)
            x = torch.randn(int(thw.prod(-1).sum()), cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2,
                            generator=g)
            out.append(Case(label, (x, thw)))
        return out
    return cases


def _qwen2_vl(size: str):
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    kw = dict(depth=2, embed_dim=32, hidden_size=48, num_heads=4, mlp_ratio=2, patch_size=2) if size == "tiny" else {}
    return redraw(Qwen2VisionTransformerPretrainedModel(Qwen2VLVisionConfig(**kw)))


def _qwen2_5_vl(size: str):
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    if size == "tiny":  # windows of 8 px = 2 x 2 merged tokens = 4 x 4 patches; full attention in block 1
        kw = dict(depth=3, hidden_size=32, out_hidden_size=48, num_heads=4, intermediate_size=64, patch_size=2,
                  window_size=8, fullatt_block_indexes=[1])
    else:  # Qwen2.5-VL-7B's vision tower (the config class defaults hidden_size to the text width)
        kw = dict(hidden_size=1280, intermediate_size=3420, out_hidden_size=3584, num_heads=16)
    return redraw(Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**kw)))


def _qwen3_vl(size: str):
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    if size == "tiny":  # a 5 x 5 learned table resized to every frame; DeepStack after blocks 0 and 1
        kw = dict(depth=3, hidden_size=32, out_hidden_size=48, num_heads=4, intermediate_size=64, patch_size=2,
                  num_position_embeddings=25, deepstack_visual_indexes=[0, 1])
    else:  # the config's defaults: Qwen3-VL's 27-block, 1152-wide tower, 48 x 48 table
        kw = {}
    return redraw(Qwen3VLVisionModel(Qwen3VLVisionConfig(**kw)))


QWEN2_GRIDS = {
    "tiny": [("one image 6x6 patches", [[1, 6, 6]]), ("one image 4x10", [[1, 4, 10]]),
             ("packed: 8x4, 2x6, video 2 frames 4x4", [[1, 8, 4], [1, 2, 6], [2, 4, 4]])],
    "full": [("one image 16x16 patches", [[1, 16, 16]]), ("one image 12x20", [[1, 12, 20]]),
             ("packed: 20x8, 8x16, video 2 frames 8x8", [[1, 20, 8], [1, 8, 16], [2, 8, 8]])],
}
QWEN25_GRIDS = {
    "tiny": [("one image 8x8 patches (4 windows)", [[1, 8, 8]]), ("one image 6x10 (partial windows)", [[1, 6, 10]]),
             ("packed: 10x6, 4x12, video 2 frames 6x4", [[1, 10, 6], [1, 4, 12], [2, 6, 4]])],
    "full": [("one image 16x16 patches (4 windows)", [[1, 16, 16]]), ("one image 12x28 (partial windows)", [[1, 12, 28]]),
             ("packed: 20x12, 8x24, video 2 frames 12x8", [[1, 20, 12], [1, 8, 24], [2, 12, 8]])],
}


# --- Pixtral: a padded image batch and image_sizes --------------------------------------------------
def _pixtral(size: str):
    from transformers import PixtralVisionConfig, PixtralVisionModel

    kw = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=64,
              patch_size=4) if size == "tiny" else {}
    return redraw(PixtralVisionModel(PixtralVisionConfig(**kw)))


def _pixtral_cases(model, size: str, g: torch.Generator) -> list:
    p = model.config.patch_size
    sq, (h, w) = 6 * p, (4 * p, 10 * p)
    return [Case(f"2 images {sq}x{sq} px", (torch.randn(2, 3, sq, sq, generator=g),)),
            Case(f"2 images {h}x{w} px", (torch.randn(2, 3, h, w, generator=g),)),
            Case(f"packed: {8 * p}x{3 * p} and {2 * p + 1}x{9 * p} px in a {8 * p}x{9 * p} batch",
                 (torch.randn(2, 3, 8 * p, 9 * p, generator=g), torch.tensor([[8 * p, 3 * p], [2 * p + 1, 9 * p]])))]


# --- Llama 4 vision: a fixed square size per config --------------------------------------------------
def _llama4(size: str, image_size: int | None = None):
    from transformers import Llama4VisionConfig
    from transformers.models.llama4.modeling_llama4 import Llama4VisionModel

    if size == "tiny":
        kw = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, patch_size=8,
                  image_size=image_size or 32, projector_input_dim=64, projector_output_dim=64, vision_output_dim=32)
    else:  # Llama 4 Scout's vision encoder (the config class's defaults do not run: 768 * 4 != 5632)
        kw = dict(hidden_size=1408, intermediate_size=5632, vision_output_dim=4096, image_size=image_size or 336)
    return redraw(Llama4VisionModel(Llama4VisionConfig(**kw)))


def _llama4_cases(model, size: str, g: torch.Generator) -> list:
    n = model.config.image_size
    return [Case(f"2 images {n}x{n} px (the config's size; the original takes no other)",
                 (torch.randn(2, 3, n, n, generator=g),))]


TOWERS = {
    "qwen2_vl": Entry("qwen2_vl", "transformers `Qwen2VisionTransformerPretrainedModel`", _qwen2_vl,
                      _qwen_cases(QWEN2_GRIDS),
                      ("last_hidden_state", "pooler_output")),
    "qwen2_5_vl": Entry("qwen2_5_vl", "transformers `Qwen2_5_VisionTransformerPretrainedModel`", _qwen2_5_vl,
                        _qwen_cases(QWEN25_GRIDS),
                        ("last_hidden_state", "pooler_output")),
    "qwen3_vl": Entry("qwen3_vl", "transformers `Qwen3VLVisionModel`", _qwen3_vl, _qwen_cases(QWEN2_GRIDS),
                      ("last_hidden_state", "pooler_output", "deepstack_features")),
    "pixtral": Entry("pixtral", "transformers `PixtralVisionModel`", _pixtral, _pixtral_cases),
    "llama4": Entry("llama4", "transformers `Llama4VisionModel`", _llama4, _llama4_cases),
    "llama4_b": Entry("llama4_b", "transformers `Llama4VisionModel`, a second config size",
                      lambda size: _llama4(size, 48 if size == "tiny" else 448), _llama4_cases),
}


def errors(entry: Entry, size: str = "tiny", seed: int = 1, original=None):
    """``[(case label, field, max abs difference, max abs output)]`` of ``entry`` at ``size``."""
    original = entry.build(size) if original is None else original
    model = convert_vit(original).eval()  # a tower converter leaves the original untouched (vispe.models.towers)
    out = []
    for case in entry.cases(original, size, torch.Generator().manual_seed(seed)):
        with torch.no_grad():
            want, got = original(*case.args, **case.kwargs), model(*case.args, **case.kwargs)
        if type(got) is not type(want):
            raise AssertionError(f"{entry.name}: the converted model returns {type(got).__name__}, "
                                 f"the original {type(want).__name__}")
        for f in entry.fields:
            a, b = getattr(got, f), getattr(want, f)
            if isinstance(b, (list, tuple)):  # a list of tensors (Qwen3-VL's deepstack_features)
                if len(a) != len(b):
                    raise AssertionError(f"{entry.name}: {f} has {len(a)} tensors, the original's {len(b)}")
                a, b = torch.cat([t.flatten() for t in a]), torch.cat([t.flatten() for t in b])
            out.append((case.label, f, (a - b).abs().max().item(), b.abs().max().item()))
    return out


def machine() -> str:
    try:
        names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
    except OSError:
        names = []
    return f"{os.cpu_count()}-core {names[0] if names else 'CPU'}, no GPU used"


def main(argv=None) -> int:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", choices=SIZES, default=["full", "tiny"],
                    help="full: the released models' sizes (minutes: run it under flock /work/heavy.lock); "
                         "tiny: the tests' configs (seconds)")
    ap.add_argument("--only", nargs="*", choices=sorted(TOWERS), help="these entries only")
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    cmd = "python results/compare/parity_towers.py" + \
        (f" --sizes {' '.join(args.sizes)}" if args.sizes != ap.get_default("sizes") else "") + \
        (f" --only {' '.join(args.only)}" if args.only else "")
    print("# Parity of the converted vision towers (random weights)\n")
    print(f"`{cmd}` at commit {commit}; {machine()} (other jobs shared it), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, float32 on CPU. Every parameter redrawn (norm weights in "
          "[0.5, 1.5], matrices N(0, 1/fan_in), the rest N(0, 0.04)). Each row: the converted model "
          "(`convert_vit(original)`) called with the original's arguments, against the original.")
    for size in args.sizes:
        torch.manual_seed(0)
        print("\n## " + ("The released models' sizes (default configs; Qwen2.5-VL at 7B's vision width, Llama 4 "
                         "Scout's encoder)" if size == "full" else "The tests' tiny configs (tests/test_towers.py)") + "\n")
        print("| reference | input | field | max abs difference | max abs output |\n|---|---|---|---|---|")
        for name in args.only or TOWERS:
            entry = TOWERS[name]
            for label, f, err, scale in errors(entry, size):
                print(f"| {entry.title} | {label} | `{f}` | {err:.1e} | {scale:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
