"""Parity of vispe's conversions of DINOv3 (timm and transformers) and NaFlex (timm) at full size,
every parameter redrawn (so layer scales of 1e-5 hide nothing): the largest absolute difference
of the outputs against the reference library, and the largest output for scale.

    .venv/bin/python results/compare/parity_dinov3_naflex.py > results/compare/parity_dinov3_naflex.md

No download: the models are built with random weights (pretrained=False, a default config).
"""
from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's vispe

from vispe.data.naflex import naflex_transform, pack  # noqa: E402
from vispe.models.naflex import forward_features_packed, forward_packed  # noqa: E402
from vispe.models.vit import convert_vit  # noqa: E402


def redraw(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and any(k in name for k in ("norm", "gamma", "lambda")):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif name.endswith("pos_embed"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def machine() -> str:
    try:
        names = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")]
    except OSError:
        names = []
    return f"{os.cpu_count()}-core {names[0] if names else 'CPU'}, no GPU used"


def row(what: str, size: str, got: torch.Tensor, want: torch.Tensor) -> str:
    return f"| {what} | {size} | {(got - want).abs().max().item():.1e} | {want.abs().max().item():.2f} |"


def main() -> int:
    import timm
    import transformers

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    rows = []
    ref = timm.create_model("vit_small_patch16_dinov3", pretrained=False, num_classes=0).eval()
    redraw(ref)
    model = convert_vit(copy.deepcopy(ref)).eval()
    for hw in [(224, 224), (160, 288)]:
        x = torch.randn(2, 3, *hw, generator=g)
        with torch.no_grad():
            rows.append(row("timm `vit_small_patch16_dinov3`, all tokens", f"{hw[0]}x{hw[1]}",
                            model.forward_features(x), ref.forward_features(x)))
    hf = transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(num_register_tokens=4)).eval()  # ViT-S/16
    redraw(hf)
    model = convert_vit(hf).eval()
    for hw in [(224, 224), (160, 288)]:
        x = torch.randn(2, 3, *hw, generator=g)
        with torch.no_grad():
            rows.append(row("transformers `DINOv3ViTModel` (ViT-S/16, 4 registers), `last_hidden_state`",
                            f"{hw[0]}x{hw[1]}", model.forward_features(x), hf(pixel_values=x).last_hidden_state))
    ref = timm.create_model("naflexvit_base_patch16_gap", pretrained=False).eval()
    redraw(ref)
    model = convert_vit(copy.deepcopy(ref)).eval()
    transform = naflex_transform(patch_size=16, max_seq_len=256)
    images = [torch.randn(3, *hw, generator=g) for hw in [(480, 160), (200, 400), (300, 300)]]
    batch = pack([transform(im) for im in images], max_seq_len=256)
    grids = ", ".join(f"{int(c[:, 0].max()) + 1}x{int(c[:, 1].max()) + 1}"
                      for c, v in zip(batch["patch_coord"], batch["patch_valid"]) for c in [c[v]])
    with torch.no_grad():
        rows.append(row("timm `naflexvit_base_patch16_gap`, logits", f"packed 256: {grids} patches",
                        forward_packed(model, batch), ref(batch)))
        want = ref.forward_features(batch["patches"], batch["patch_coord"], batch["patch_valid"])["patches"]
        got = forward_features_packed(model, batch)
        valid = torch.cat([torch.ones(3, model.num_prefix_tokens, dtype=torch.bool), batch["patch_valid"]], 1)
        rows.append(row("timm `naflexvit_base_patch16_gap`, valid tokens", f"packed 256: {grids} patches",
                        got[valid], want[valid]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    print("# Parity of the DINOv3 and NaFlex conversions (full-size models, random weights)\n")
    print(f"`python results/compare/parity_dinov3_naflex.py` at commit {commit}; {machine()} (other jobs shared it), "
          f"torch {torch.__version__}, timm {timm.__version__}, transformers {transformers.__version__}, "
          "float32 on CPU. Every parameter redrawn (norms and layer scales in [0.5, 1.5], weights N(0, 1/fan_in), "
          "NaFlex's table N(0, 1)).\n")
    print("| model | input | max abs difference | max abs output |\n|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
