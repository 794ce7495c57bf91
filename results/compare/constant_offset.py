"""How much of a fixed sin-cos code is a constant: per grid size and temperature (constant_offset.md).

For each code, grid (n x n tokens) and temperature, the code's channels c are split over the grid's
tokens t into their mean and what varies with position::

    total^2 = mean_{t,c} PE[t,c]^2 = constant^2 + varying^2
    constant = RMS_c( mean_t PE[t,c] )        varying = RMS_c( std_t PE[t,c] )

and the channels whose spread over the grid (std_t) is below 0.05 are counted: they add nearly the
same number to every token. ``center=True`` removes the constant part exactly (vispe.image._additive).
Codes as the digits configs build them (no class-token row: issue 19's prefix rule), float32, CPU,
seconds::

    .venv/bin/python results/compare/constant_offset.py    # prints the tables; update.py writes them into the .md
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's vispe

from vispe.registry import get  # noqa: E402

GRIDS = (8, 12, 16, 24, 32)
TEMPERATURES = (20.0, 100.0, 1000.0, 10000.0)
FLAT = 0.05  # a channel "barely varies" below this spread over the grid
# sine: DETR's, normalised to (0, 2*pi]; sincos2d: MAE's, integer index 0..n-1 (the digits configs)
CODES = ("sine", "sincos2d")


def split(code: torch.Tensor) -> dict[str, float]:
    """Total, constant and varying RMS of a (N, C) code, and its per-channel spread."""
    mean = code.mean(0)  # (C,)
    std = code.std(0, unbiased=False)  # (C,)
    return {"total": code.pow(2).mean().sqrt().item(), "constant": mean.pow(2).mean().sqrt().item(),
            "varying": std.pow(2).mean().sqrt().item(), "flat": int((std < FLAT).sum()),
            "std_min": std.min().item(), "std_med": std.median().item(), "std_max": std.max().item()}


def measure(pe: str, n: int, temperature: float, dim: int) -> dict[str, float]:
    enc = get(pe)(dim, temperature=temperature)
    code = enc((n, n), None)[0].float()  # (n*n, dim)
    out = split(code)
    centred = get(pe)(dim, temperature=temperature, center=True)((n, n), None)[0].float()  # (n*n, dim)
    out["centred_constant"] = split(centred)["constant"]
    return out


def table(pe: str, dim: int, grids=GRIDS, temperatures=TEMPERATURES) -> str:
    rows = [f"| grid | temperature | total RMS | constant RMS | varying RMS | constant / varying | "
            f"channels with spread < {FLAT} (of {dim}) | spread min / median / max | constant after centring |",
            "|---|---|---|---|---|---|---|---|---|"]
    for n in grids:
        for t in temperatures:
            m = measure(pe, n, t, dim)
            rows.append(f"| {n}x{n} | {t:g} | {m['total']:.3f} | {m['constant']:.3f} | {m['varying']:.3f} | "
                        f"{m['constant'] / m['varying']:.2f} | {m['flat']} | "
                        f"{m['std_min']:.3f} / {m['std_med']:.3f} / {m['std_max']:.3f} | "
                        f"{'< 1e-6' if m['centred_constant'] < 1e-6 else format(m['centred_constant'], '.1e')} |")
    return "\n".join(rows)


def markdown() -> str:
    """The tables of constant_offset.md (update.py fills its block with them)."""
    parts = []
    for pe in CODES:
        parts += [f"**`{pe}`, 64 channels (vit_pico's width)**", "", table(pe, 64), ""]
    parts += ["**`sincos2d`, 192 channels (DeiT-tiny's width) at 14x14 (224 px, patch 16), for scale**", "",
              table("sincos2d", 192, grids=(14,), temperatures=(10000.0,))]
    return "\n".join(parts)


def main() -> int:
    print(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
