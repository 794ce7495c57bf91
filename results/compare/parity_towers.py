"""Parity of vispe's converted vision towers (``convert_vit``, ``vispe.models.towers``) against the
reference library, every parameter redrawn: the largest absolute difference of each output field
on each input, and the largest output for scale. One entry per tower in ``TOWERS``.

    flock /work/heavy.lock .venv/bin/python results/compare/parity_towers.py > results/compare/parity_towers.md
    .venv/bin/python results/compare/parity_towers.py --sizes tiny --only pixtral   # the tests' small configs

No download: each model is built from a config with random weights, at the released model's size
(``full``) or a tiny one (``tiny``, what ``tests/test_towers.py`` runs). Adding a tower is one
``Entry``: its name, a builder ``build(size) -> model`` and ``cases(model, size, g) -> [Case]`` (the inputs,
in the original's call, with a label); ``fields`` are the output fields compared. The contract is in
``tower_cases.py``, the builders and cases beside it: ``towers_multimodal.py`` (the vision-language models'
towers) and ``towers_segmentation.py`` (SAM, EoMT, SAM 3, Hiera); this file lists them and measures.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's vispe
sys.path.insert(0, str(HERE))  # the entries' files beside this one

from vispe.models.vit import convert_vit  # noqa: E402

from tower_cases import SIZES, Case, Entry, redraw  # noqa: E402, F401  (Case, redraw: for callers of this script)
from towers_multimodal import (  # noqa: E402
    QWEN2_GRIDS, QWEN25_GRIDS, _idefics3, _idefics3_cases, _llama4, _llama4_cases, _pixtral, _pixtral_cases, _qwen2_5_vl,
    _qwen2_vl, _qwen3_vl, _qwen_cases, _siglip2, _siglip2_cases)
from towers_segmentation import (  # noqa: E402
    EOMT_FIELDS, _eomt, _eomt_cases, _eomt_dinov3_wide, _hf_sam, _hf_sam_cases, _hiera, _hiera_cases, _hiera_off_grid,
    _sam3_cases, _sam3_transformers_layout, _sam3_vit, _sam3_vit_wide, _timm_sam, _timm_sam_cases)

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
    # SAM, SigLIP2, Idefics3 (branch i37b): the position tables of SAM are redrawn too (_redraw_sam_tables)
    "hf_sam": Entry("hf_sam", "transformers `SamVisionEncoder`", _hf_sam, _hf_sam_cases),
    "hf_sam_b": Entry("hf_sam_b", "transformers `SamVisionEncoder`, a second config size",
                      lambda size: _hf_sam(size, 24 if size == "tiny" else 512), _hf_sam_cases),
    "timm_sam": Entry("timm_sam", "timm `VisionTransformerSAM` (`forward`: the neck's map, no head)", _timm_sam,
                      _timm_sam_cases, ("",)),
    "siglip2": Entry("siglip2", "transformers `Siglip2VisionModel`", _siglip2, _siglip2_cases,
                     ("last_hidden_state", "pooler_output")),
    "idefics3": Entry("idefics3", "transformers `Idefics3VisionTransformer`", _idefics3, _idefics3_cases),
    # issue 50: segmentation towers at any size
    "eomt": Entry("eomt", "transformers `EomtForUniversalSegmentation`", _eomt, _eomt_cases, EOMT_FIELDS),
    "eomt_dinov3": Entry("eomt_dinov3", "transformers `EomtDinov3ForUniversalSegmentation`",
                         lambda size: _eomt(size, dinov3=True), _eomt_cases, EOMT_FIELDS),
    "eomt_dinov3_wide": Entry("eomt_dinov3_wide", "transformers `EomtDinov3ForUniversalSegmentation`, twice the width",
                              _eomt_dinov3_wide, _eomt_cases, EOMT_FIELDS),
    "sam3_vit": Entry("sam3_vit", "transformers `Sam3ViTModel`", _sam3_vit, _sam3_cases),
    "sam3_vit_nonsquare": Entry("sam3_vit_nonsquare", "transformers `Sam3ViTModel`, a non-square config "
                                "(`rope_positions=\"transformers\"`)",
                                lambda size: _sam3_vit(size, [48, 72] if size == "tiny" else [1008, 1344]),
                                _sam3_cases, convert=_sam3_transformers_layout),
    "sam3_vit_wide": Entry("sam3_vit_wide", "transformers `Sam3ViTModel`, twice the width", _sam3_vit_wide,
                           _sam3_cases),
    "hiera": Entry("hiera", "transformers `Sam2HieraDetModel`", _hiera, _hiera_cases,
                   ("last_hidden_state", "intermediate_hidden_states")),
    "hiera_off_grid": Entry("hiera_off_grid", "transformers `Sam2HieraDetModel`, a grid off the window multiples",
                            _hiera_off_grid, _hiera_cases, ("last_hidden_state", "intermediate_hidden_states")),
}


def errors(entry: Entry, size: str = "tiny", seed: int = 1, original=None):
    """``[(case label, field, max abs difference, max abs output)]`` of ``entry`` at ``size``."""
    original = entry.build(size) if original is None else original
    model = (entry.convert or convert_vit)(original).eval()  # the original is left untouched (vispe.models.towers)
    out = []
    for case in entry.cases(original, size, torch.Generator().manual_seed(seed)):
        with torch.no_grad():
            want, got = original(*case.args, **case.kwargs), model(*case.args, **case.kwargs)
        if type(got) is not type(want):
            raise AssertionError(f"{entry.name}: the converted model returns {type(got).__name__}, "
                                 f"the original {type(want).__name__}")
        for f in entry.fields:
            a, b = (getattr(got, f), getattr(want, f)) if f else (got, want)  # "": the output itself (timm)
            if isinstance(b, (list, tuple)):  # a list of tensors (Qwen3-VL's deepstack_features)
                if len(a) != len(b):
                    raise AssertionError(f"{entry.name}: {f} has {len(a)} tensors, the original's {len(b)}")
                a, b = torch.cat([t.flatten() for t in a]), torch.cat([t.flatten() for t in b])
            out.append((case.label, f or "output", (a - b).abs().max().item(), b.abs().max().item()))
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
