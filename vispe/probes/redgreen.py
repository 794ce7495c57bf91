"""Kayhan & van Gemert's red-green task (CVPR 2020, Exp. 2): can a CNN exploit absolute location
through its borders?

Two classes of 32x32 images with two 4x4 boxes on a black canvas: class 0 = a red box left of a
green one, class 1 = a green box left of a red one. In training, class 0 always lies near row 7
and class 1 near row 23 (y jitter of -4..3 rows), so a network can answer either from the boxes'
order (translation invariant) or from where they are (absolute location). The *similar* test set
places the classes as in training; the *dissimilar* one moves each class 16 rows to the other
class's place. A network that reads the order scores the same on both; one that reads location
collapses on *dissimilar*. The network (the authors' set-up): 4 convolutions 3x3 (32, 32, 64, 64
channels, strides 1, 2, 2, 2, no bias), ReLU, global max pooling, a linear layer; Adadelta (lr 1,
rho 0.9, eps 1e-6, weight decay 5e-5), batch 200, at most 50 epochs with early stopping on the
validation loss (patience 8), the best validation model tested; 2000 training, 1000 validation and
1000 test images.

Convolution types (``CONV_TYPES``): ``valid`` (no padding), ``same_zeros`` (1 pixel of zeros),
``same_circular`` (1 pixel, circular), ``full_zeros`` (2 pixels of zeros: a full convolution) and
``full_circular`` (2 pixels, circular: what the authors' code runs for its "circular" row).

    python -m vispe.probes.redgreen --seeds 0 1 2 --out results/compare/redgreen.csv
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from vispe import _checks

CONV_TYPES = {"valid": (0, "zeros"), "same_zeros": (1, "zeros"), "same_circular": (1, "circular"),
              "full_zeros": (2, "zeros"), "full_circular": (2, "circular")}
SIZE, BOX, ROWS, SHIFT = 32, 4, (7, 23), 16


def make_redgreen(n: int, seed: int, *, dissimilar: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (n, 3, 32, 32) in {0, 1} (channel 0 red, 1 green) and labels (n,), balanced, alternating."""
    _checks.positive_int("n", n)
    rng = np.random.default_rng(seed)  # the dissimilar set: the same draws, moved
    x = np.zeros((n, 3, SIZE, SIZE), dtype=np.float32)
    labels = np.arange(n) % 2  # (n,)
    free = SIZE - BOX
    for i, c in enumerate(labels):
        row = ROWS[c] + (SHIFT if c == 0 else -SHIFT) * dissimilar
        left, right = (0, 1) if c == 0 else (1, 0)  # class 0: red (0) left of green (1)
        x1 = rng.integers(0, free // 2 - BOX)  # the left box in the left part
        x2 = rng.integers(x1 + BOX + 1, free)  # the right box at least one pixel apart
        for ch, xx in ((left, x1), (right, x2)):
            y = row + rng.integers(-4, 4)  # -4..3
            x[i, ch, y:y + BOX, xx:xx + BOX] = 1.0
    return torch.from_numpy(x), torch.from_numpy(labels)


class RedGreenNet(nn.Module):
    """4 convs (3x3, strides 1, 2, 2, 2, no bias) + ReLU, global max pooling, linear (2 classes)."""

    def __init__(self, conv_type: str = "same_zeros") -> None:
        super().__init__()
        pad, mode = CONV_TYPES[_checks.choice("conv_type", conv_type, tuple(CONV_TYPES))]
        chans, strides = (3, 32, 32, 64, 64), (1, 2, 2, 2)
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, stride=s, padding=pad, padding_mode=mode, bias=False)
                                   for a, b, s in zip(chans, chans[1:], strides))
        self.fc = nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, 2)
        for conv in self.convs:
            x = F.relu(conv(x))
        return self.fc(x.amax(dim=(-2, -1)))  # global max pooling: (B, 64)


def _loss_acc(net, x, y, batch: int = 500) -> tuple[float, float]:
    net.eval()
    with torch.no_grad():
        logits = torch.cat([net(x[i:i + batch]) for i in range(0, len(x), batch)])
    return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def run_one(conv_type: str, seed: int, *, n_train: int = 2000, n_val: int = 1000, n_test: int = 1000,
            epochs: int = 50, patience: int = 8, batch: int = 200) -> dict:
    """Train one network and test it on the similar and dissimilar sets; one result row."""
    t0 = time.time()
    xtr, ytr = make_redgreen(n_train, 3 * seed)
    xva, yva = make_redgreen(n_val, 3 * seed + 1)
    xte, yte = make_redgreen(n_test, 3 * seed + 2)
    xdi, ydi = make_redgreen(n_test, 3 * seed + 2, dissimilar=True)  # same draws, other place
    torch.manual_seed(seed)
    net = RedGreenNet(conv_type)
    opt = torch.optim.Adadelta(net.parameters(), lr=1.0, rho=0.9, eps=1e-6, weight_decay=5e-5)
    best, best_state, waited, ran = float("inf"), None, 0, 0
    for epoch in range(epochs):
        net.train()
        for i in range(0, n_train, batch):  # the authors' loader: fixed order, no shuffling
            opt.zero_grad()
            F.cross_entropy(net(xtr[i:i + batch]), ytr[i:i + batch]).backward()
            opt.step()
        ran = epoch + 1
        val_loss, _ = _loss_acc(net, xva, yva)
        if val_loss < best:
            best, best_state, waited = val_loss, {k: v.clone() for k, v in net.state_dict().items()}, 0
        else:
            waited += 1
            if waited > patience:
                break
    net.load_state_dict(best_state)
    return {"conv_type": conv_type, "seed": seed, "similar_acc": _loss_acc(net, xte, yte)[1] * 100,
            "dissimilar_acc": _loss_acc(net, xdi, ydi)[1] * 100, "train_acc": _loss_acc(net, xtr, ytr)[1] * 100,
            "epochs_run": ran, "best_val_loss": best, "seconds": round(time.time() - t0, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m vispe.probes.redgreen", description=__doc__.split("\n\n")[0])
    p.add_argument("--conv-types", nargs="+", default=list(CONV_TYPES), choices=list(CONV_TYPES))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="CSV of one row per (conv type, seed)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for ct in args.conv_types:
        for seed in args.seeds:
            rows.append(run_one(ct, seed, epochs=args.epochs))
            r = rows[-1]
            print(f"{ct:14s} seed {seed}: similar {r['similar_acc']:5.1f}  dissimilar {r['dissimilar_acc']:5.1f}  "
                  f"({r['epochs_run']} epochs, {r['seconds']:.0f}s)", flush=True)
    df = pd.DataFrame(rows)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.out, index=False)
    print(df.groupby("conv_type", sort=False)[["similar_acc", "dissimilar_acc"]].agg(["mean", "std"]).round(1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
