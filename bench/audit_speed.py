"""How long ``vispe.audit`` takes on ViT-B-sized timm models (random weights, default sizes).

    flock /tmp/vispe-heavy.lock python bench/audit_speed.py [--rounds 2]

Prints the commit, torch's thread count and each round's seconds per model (the first round of a
model includes torch's first-call costs). The issue's target: under 30 s on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import subprocess
import time

import timm
import torch

from vispe.audit import audit

MODELS = ("vit_base_patch16_224", "vit_base_patch16_rope_reg1_gap_256")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"commit {commit}, torch threads {torch.get_num_threads()}", flush=True)
    for name in MODELS:
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, dynamic_img_size=True)
        for r in range(args.rounds):
            start = time.perf_counter()
            report = audit(model)
            print(f"{name} round {r}: {time.perf_counter() - start:.1f} s, position {report.family}, "
                  f"{len(report.defects)} defect(s)", flush=True)


if __name__ == "__main__":
    main()
