"""Per-token RMS at initialisation: the patch embeddings of digits_content_position images against
each input code added to them (embedded_tasks.md, the reading of digits_content_position).

    .venv/bin/python results/compare/init_scale.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's vispe

from vispe.data.digits_canvas import DigitsCanvas  # noqa: E402
from vispe.models.vit import create_vit  # noqa: E402

CODES = ("learned_abs", "fourier", "sine", "sincos2d", "axis2d", "normidx2d")


def main() -> int:
    x = DigitsCanvas("content_position", "train", n_train=256, n_test=32).images  # (256, 1, 32, 32)
    for pe in CODES:
        torch.manual_seed(0)
        m = create_vit("vit_pico", pe=pe, img_size=32, patch_size=4, num_classes=20, in_chans=1)
        tokens = m.patch_embed(x)  # (B, h*w, 64)
        code = m.pe(tuple(m.patch_embed.grid_size), None)  # (1, h*w, 64), (h, w) = (8, 8)
        print(f"{pe:12s} patch embeddings {tokens.pow(2).mean().sqrt():.3f}   code {code.pow(2).mean().sqrt():.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
