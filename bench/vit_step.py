"""Training-step time of a CIFAR-sized ViT per encoding, as ratios to ``pe="none"``.

    python3 bootstrap.py bench/vit_step.py [--device cpu|cuda] [--rounds 5] [--batch 64]

The model is 32x32 images, patch 4 (64 tokens + class token), dim 192, depth 6, 3 heads.
Encodings are timed side by side, interleaved round by round (these machines are noisy); the
printed figure is the median over rounds of each encoding's step time divided by that round's
``none`` step time. One step = forward + backward + AdamW update.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from vispe.models.vit import create_vit

ENCODINGS = ["none", "learned_abs", "sine", "rope_axial", "rope_mixed", "relbias", "peg"]


def step_time(model, opt, x, y, iters: int, device: str) -> float:
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync()
    return (time.perf_counter() - t0) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--encodings", nargs="*", default=ENCODINGS)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = args.device
    x = torch.randn(args.batch, 3, 32, 32, device=dev)
    y = torch.randint(0, 10, (args.batch,), device=dev)
    runs = {}
    for name in args.encodings:
        m = create_vit("vit_cifar", pe=name, img_size=32, patch_size=4, num_classes=10).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        step_time(m, opt, x, y, 2, dev)  # warm-up
        runs[name] = (m, opt)
    times = {n: [] for n in runs}
    for _ in range(args.rounds):
        for n, (m, opt) in runs.items():
            times[n].append(step_time(m, opt, x, y, args.iters, dev))
    base = times["none"] if "none" in times else times[args.encodings[0]]
    where = torch.cuda.get_device_name() if dev == "cuda" else f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"
    print(f"# ViT step time (32x32, patch 4, dim 192, depth 6, batch {args.batch}) on {where}; torch {torch.__version__}")
    print(f"{'encoding':<14}{'ms/step':>10}{'ratio to none':>16}")
    for n, ts in times.items():
        ratio = statistics.median(t / b for t, b in zip(ts, base))
        print(f"{n:<14}{1e3 * statistics.median(ts):>10.1f}{ratio:>16.2f}")


if __name__ == "__main__":
    main()
