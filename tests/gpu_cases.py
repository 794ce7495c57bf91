"""The cases of the CUDA tier (``tests/test_gpu_*.py``, marker ``gpu``) and of ``bench/gpu_check.py``.

Every case is built here on any device: the tier runs it on CUDA against the CPU, ``tests/test_gpu_tier.py``
and ``bench/gpu_check.py --dry-run`` build and run each one tiny on the CPU, so a case that no longer builds
(a renamed option, a new encoding that needs another placement) fails on a machine without a GPU too.

The encodings are the registry's (``vispe.available()``) and the detector's designs its registries'
(``detector_designs``); the models are small, the batches padded and non-square.
"""
from __future__ import annotations

import copy

import torch

import vispe
from vispe.kernels.explain import KERNELS, _tensors
from vispe.models.detr import create_detr
from vispe.models.vit import create_vit

ENCODINGS = tuple(vispe.available())
#: CUDA against CPU, float32 (TF32 off): the issue's bound
F32_TOL = 1e-4
#: bf16 autocast against float32 on the same device: the relative error ||bf16 - f32|| / ||f32|| of the ViT's
#: tokens and logits. Measured under CPU autocast (bf16 products with float32 accumulation, as CUDA's):
#: at most 1.4e-2 over every ViT and detector case (tests/test_gpu_tier.py checks the bound holds there)
BF16_REL = 3e-2
#: ViT: 24 x 40 pixels, patch 4: a 6 x 10 grid, one class and one register token
IMG, PATCH = (24, 40), 4
#: detector: 64 x 96 pixels; the small CNN's stride 16 gives 4 x 6 cells
DET_IMG, DET_GRID = (64, 96), (4, 6)
DENSE_SMALL = dict(backbone="small_cnn", backbone_widths=(8, 16, 16, 32), d_model=32, nheads=4, enc_layers=1,
                   dec_layers=2, dim_feedforward=64, num_queries=6, dropout=0.0)
DEFORMABLE_SMALL = dict(backbone="small_cnn", backbone_widths=(4, 8, 8), d_model=32, nheads=2, enc_layers=1,
                        dec_layers=2, dim_feedforward=32, num_queries=3, dropout=0.0, num_feature_levels=2,
                        backbone_levels=1, n_points=2)
#: the designs of today, used only where the detector's registries are not where this module looks
KNOWN_DESIGNS = {"dense": ("detr", "conditional", "dab"), "deformable": ("deformable", "dab", "dino")}


def skip_reason() -> str | None:
    """Why the tier cannot run here (one line), or None on a machine with a CUDA GPU."""
    if torch.cuda.is_available():
        return None
    return (f"gpu tier: no CUDA GPU here (torch {torch.__version__}, torch.cuda.is_available() is False); "
            "on a GPU machine: PYTHONPATH=. python bench/gpu_check.py")


def family(name: str) -> str:
    return vispe.registry.get(name).family


def detector_designs() -> dict[str, tuple[str, ...]]:
    """{operator: designs}: the query designs each cross-attention operator takes, read from the detector's
    registries (``designs.STRATEGIES``, ``designs.OPERATORS``, ``rules.DESIGNS``)."""
    try:
        from vispe.models.detr.design import designs, rules

        dense = tuple(d for d in designs.STRATEGIES if d not in rules.DESIGNS_ONLY)
        return {op: dense if op == "dense" else tuple(rules.DESIGNS) for op in designs.OPERATORS}
    except (ImportError, AttributeError):  # the registries moved: today's names (create_detr refuses a stale one)
        return dict(KNOWN_DESIGNS)


def perturbed(model: torch.nn.Module, scale: float = 0.05, seed: int = 0) -> torch.nn.Module:
    """Every parameter moved off its initial value (zero-initialised tables would hide a difference)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p) * scale)
    return model


# ----------------------------------------------------------------------------------------- the ViT
def vit(name: str, img=IMG, **kw) -> torch.nn.Module:
    """A two-block ViT with encoding ``name`` (class and register token, average pooling), perturbed, eval."""
    torch.manual_seed(0)
    m = create_vit("vit_pico", pe=name, embed_dim=32, depth=2, num_heads=2, img_size=img, patch_size=PATCH,
                   num_classes=5, global_pool="avg", class_token=True, reg_tokens=1, **kw)
    return perturbed(m).eval()


def vit_batch(device, img=IMG, batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (B, 3, H, W) and their padding mask (B, H, W): image 0 whole, image 1 padded on the right
    (two patch columns), image 2 at the bottom and right (one patch row, three columns)."""
    H, W = img
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, H, W, generator=g)
    mask = torch.zeros(batch, H, W, dtype=torch.bool)
    mask[1, :, W - 2 * PATCH:] = True
    if batch > 2:
        mask[2, H - PATCH:] = True
        mask[2, :, W - 3 * PATCH:] = True
    x[mask[:, None].expand_as(x)] = 0.0
    return x.to(device), mask.to(device)


def vit_outputs(model, x, mask) -> list[torch.Tensor]:
    """The tokens after the last block (B, P+N, C) and the logits (B, classes)."""
    tokens, ctx = model.forward_tokens(x, mask)
    return [tokens, model.forward_head(tokens, mask=ctx.mask)]


# ------------------------------------------------------------------------------------ the detector
def detr_placement(name: str, attention: str = "dense") -> dict:
    """What ``create_detr`` needs for an encoding of ``name``'s family (``vispe.models.detr.design.placement``):
    additive and none as they are; rotary and bias in the encoder with a sine code for the decoder's keys;
    conditional (PEG) at the encoder input."""
    fam = family(name)
    kw: dict = {"grid": DET_GRID} if attention == "dense" else {}
    if attention == "deformable":
        if name in ("learned_abs",):
            kw["grid"] = (DET_GRID[0] * 2, DET_GRID[1] * 2)  # level 0 at stride 8
        if fam == "conditional":
            kw["pe_at"] = {"encoder": "input", "decoder": "attn"}
        return kw
    if fam in ("rotary", "bias"):
        kw["dec_pe"] = "sine"
    if fam == "conditional":
        kw.update(dec_pe="sine", pe_at={"encoder": "input", "decoder": "attn"})
    return kw


def detector_cases() -> list[tuple[str, str, str]]:
    """(encoding, design, operator): every encoding in DETR's design with dense attention, the other
    designs of each operator with ``sine``, and every encoding the deformable operator takes (additive,
    conditional, none: it has no q.k to rotate or bias) in its first design."""
    designs = detector_designs()
    cases = [(name, designs["dense"][0], "dense") for name in ENCODINGS]
    cases += [("sine", d, op) for op, ds in designs.items() for d in ds if (op, d) != ("dense", designs["dense"][0])]
    if "deformable" in designs:
        first = designs["deformable"][0]
        cases += [(n, first, "deformable") for n in ENCODINGS
                  if family(n) not in ("rotary", "bias") and (n, first, "deformable") not in cases]
    return cases


def detector(name: str = "sine", design: str = "detr", attention: str = "dense") -> torch.nn.Module:
    torch.manual_seed(0)
    base = DENSE_SMALL if attention == "dense" else dict(DEFORMABLE_SMALL, attention=attention)
    m = create_detr(4, **{**base, "pe": name, "decoder": design, **detr_placement(name, attention)})
    return perturbed(m).eval()


def detector_batch(device, img=DET_IMG) -> tuple[torch.Tensor, torch.Tensor]:
    """Two images (2, 3, H, W), the second padded on the right (a third) and at the bottom (a quarter)."""
    H, W = img
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, H, W, generator=g)
    mask = torch.zeros(2, H, W, dtype=torch.bool)
    mask[1, :, W - W // 3:] = True
    mask[1, H - H // 4:] = True
    return x.to(device), mask.to(device)


def detector_outputs(model, x, mask) -> list[torch.Tensor]:
    return list(_tensors(model(x, mask)))


# ---------------------------------------------------------------------------------------- running
def on(model: torch.nn.Module, device) -> torch.nn.Module:
    """A copy of ``model`` on ``device`` (the original stays where it is)."""
    return copy.deepcopy(model).to(device)


class no_tf32:
    """float32 products and convolutions in float32 on CUDA (TF32 off) while inside; restored after."""

    def __enter__(self):
        self.saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        return self

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


def tol_used(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest |a - b| / (F32_TOL + F32_TOL |b|) over every element of every pair: at most 1 when ``a``
    equals ``b`` within rtol = atol = F32_TOL (``torch.testing.assert_close``'s rule)."""
    if len(a) != len(b) or any(s.shape != t.shape for s, t in zip(a, b)):
        raise AssertionError(f"outputs {[tuple(s.shape) for s in a]} against {[tuple(t.shape) for t in b]}")
    return max(((s.detach().float().cpu() - t.detach().float().cpu()).abs()
                / (F32_TOL * (1 + t.detach().float().cpu().abs()))).max().item() for s, t in zip(a, b))


def rel_err(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """max over outputs of ||a - b|| / ||b|| (Frobenius), in float32."""
    return max((s.detach().float() - t.detach().float()).norm().item() / max(t.detach().float().norm().item(), 1e-12)
               for s, t in zip(a, b))


def parity(build, batch, outputs, device) -> float:
    """``tol_used`` by a model's outputs on ``device`` against the same model on the CPU, float32."""
    model = build()
    x, mask = batch("cpu")
    with torch.no_grad(), no_tf32():
        want = outputs(model, x, mask)
        got = outputs(on(model, device), x.to(device), mask.to(device))
    return tol_used(got, want)


def bf16_error(build, batch, outputs, device) -> float:
    """``rel_err`` of bf16 autocast against float32, on ``device``."""
    model = on(build(), device)
    x, mask = batch(device)
    with torch.no_grad(), no_tf32():
        want = outputs(model, x, mask)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            got = outputs(model, x, mask)
    return rel_err(got, want)


KERNEL_NAMES = tuple(k for _, k in KERNELS)
