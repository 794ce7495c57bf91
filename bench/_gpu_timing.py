"""The timing cases of ``bench/gpu_check.py``: a ViT training step per encoding and timm's equivalents, and
the detector designs' step, each on a deadline, with peak memory.

ViT: width 384, 6 heads, 4 blocks, patch 16, a class token; grids of 32 x 32, 64 x 64 and 128 x 128 patches
(1,024, 4,096 and 16,384 tokens), the batch sized so that every step holds 16,384 patch tokens (16, 4, 1
images). One step: forward under bf16 autocast, cross-entropy, backward, AdamW (``_common.train_step``).
Detector: every design of the detector's registries with ``sine``, a ResNet-50 (random weights), d_model
256, 8 heads, 6 + 6 layers, 100 queries (deformable: 4 levels, 4 points, 300 queries), two images padded
to 640 x 640 (the second 512 x 480 valid); one step: forward under bf16 autocast, the sum of every
output's logits and boxes (the set loss's Hungarian matching runs on the host and would time that
instead), backward, AdamW. ``tiny=True``: the same cases at a few tokens, on any device (the dry run).
"""
from __future__ import annotations

import random
import time

import torch
from _common import train_step

from vispe.kernels.explain import _tensors
from vispe.models.detr import create_detr
from vispe.models.vit import create_vit

TOKENS = (1024, 4096, 16384)
STEP_TOKENS = 16384  # patch tokens per step: batch = STEP_TOKENS // tokens
VIT = dict(embed_dim=384, depth=4, num_heads=6, patch_size=16, num_classes=10)
TINY_VIT = dict(embed_dim=32, depth=1, num_heads=2, patch_size=4, num_classes=10)
#: timm's model for an encoding (the rows of bench/vit_vs_timm.py)
TIMM = {"none": "vit_none", "learned_abs": "vit_learn", "rope_axial": "eva_axial", "rope_mixed": "eva_mixed",
        "relbias": "vit_relpos"}


def side(tokens: int) -> int:
    n = int(round(tokens ** 0.5))
    if n * n != tokens:
        raise ValueError(f"tokens={tokens}: expected a square number")
    return n


def vit_model(pe: str, tokens: int, *, tiny: bool = False) -> torch.nn.Module:
    kw = TINY_VIT if tiny else VIT
    img = side(tokens) * kw["patch_size"]
    return create_vit("vit_cifar", pe=pe, img_size=img, class_token=True, global_pool="token", **kw)


def timm_model(name: str, tokens: int, *, tiny: bool = False) -> torch.nn.Module:
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer
    from timm.models.vision_transformer_relpos import VisionTransformerRelPos

    kw = TINY_VIT if tiny else VIT
    common = dict(img_size=side(tokens) * kw["patch_size"], **kw)
    if name in ("vit_none", "vit_learn"):
        return VisionTransformer(**common, **({"pos_embed": "none"} if name == "vit_none" else {}))
    if name in ("eva_axial", "eva_mixed"):
        return Eva(**common, use_abs_pos_emb=False, use_rot_pos_emb=True, global_pool="token",
                   rope_type="cat" if name == "eva_axial" else "mixed")
    if name == "vit_relpos":
        return VisionTransformerRelPos(**common, rel_pos_type="bias", class_token=True, global_pool="token")
    raise ValueError(f"timm model {name!r}: expected one of {', '.join(TIMM.values())}")


def vit_cases(encodings, tokens: int, device, *, tiny: bool = False) -> dict:
    """{label: builder of a step closure} for every encoding and timm equivalent at ``tokens`` tokens."""
    batch = max(1, STEP_TOKENS // tokens) if not tiny else 2
    img = side(tokens) * (TINY_VIT if tiny else VIT)["patch_size"]

    def stepper(build):
        def make():
            torch.manual_seed(0)
            x = torch.randn(batch, 3, img, img, device=device)
            y = torch.randint(0, 10, (batch,), device=device)
            return train_step(build().to(device).train(), x, y, bf16_autocast=True)
        return make
    cases = {f"vispe {pe}": stepper(lambda pe=pe: vit_model(pe, tokens, tiny=tiny)) for pe in encodings}
    cases.update({f"timm {pe} ({name})": stepper(lambda name=name: timm_model(name, tokens, tiny=tiny))
                  for pe, name in TIMM.items()})
    return cases


def detector_step(design: str, attention: str, device, *, tiny: bool = False):
    """A step closure of the detector design (module docstring)."""
    torch.manual_seed(0)
    if tiny:
        import gpu_cases as G

        kw = dict(G.DENSE_SMALL if attention == "dense" else dict(G.DEFORMABLE_SMALL, attention=attention))
        size, valid = (64, 96), (48, 64)
    else:
        kw = dict(backbone="resnet50", d_model=256, nheads=8, enc_layers=6, dec_layers=6, dim_feedforward=1024,
                  num_queries=100 if attention == "dense" else 300, dropout=0.0)
        if attention != "dense":
            kw.update(attention=attention, num_feature_levels=4, n_points=4)
        size, valid = (640, 640), (512, 480)
    model = create_detr(91, pe="sine", decoder=design, **kw).to(device).train()
    x = torch.randn(2, 3, *size, device=device)
    mask = torch.zeros(2, *size, dtype=torch.bool, device=device)
    mask[1, valid[0]:] = True
    mask[1, :, valid[1]:] = True
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step():
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            out = model(x, mask)
        loss = sum(t.float().sum() for t in _tensors(out) if t.requires_grad)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def time_cases(cases: dict, *, deadline: float, rounds: int = 5, device="cuda", log=print) -> dict:
    """{label: {"ms": median ms per step or None, "peak": peak bytes of the step or None, "note": str}}.

    Each case is built and stepped twice (warm-up; the second step's peak above what was allocated before
    it, ``torch.cuda.max_memory_allocated``), then every case that built is stepped once per round, in a
    new seeded order each round, until ``rounds`` rounds or ``deadline`` (``time.time()``). A case that runs out
    of memory or failing is noted (with the error) and dropped; one not reached before the deadline is noted."""
    cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out, steps = {}, {}
    for label, make in cases.items():
        if time.time() > deadline:
            out[label] = dict(ms=None, peak=None, note="not run: stage budget spent")
            continue
        try:
            step = make()
            step()
            sync()
            if cuda:
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            step()
            sync()
            peak = torch.cuda.max_memory_allocated() - before if cuda else None
            steps[label], out[label] = step, dict(ms=None, peak=peak, note="", times=[])
            log(f"  built {label}")
        except torch.cuda.OutOfMemoryError:
            out[label] = dict(ms=None, peak=None, note="out of memory")
            log(f"  {label}: out of memory")
        except Exception as e:  # one failing case must not cost the machine's other figures
            out[label] = dict(ms=None, peak=None, note=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            log(f"  {label}: {out[label]['note']}")
        if cuda:
            torch.cuda.empty_cache()
    order, rng = list(steps), random.Random(0)
    for r in range(rounds):
        if r and time.time() > deadline:  # at least one timed round
            break
        rng.shuffle(order)  # a new order each round: no case always follows the same one
        for label in order:
            step = steps[label]
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            out[label]["times"].append(time.perf_counter() - t0)
    for label in steps:
        ts = sorted(out[label].pop("times"))
        out[label]["ms"] = 1e3 * ts[len(ts) // 2] if ts else None
        out[label]["note"] = f"{len(ts)} rounds"
    return out
