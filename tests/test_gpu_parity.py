"""CUDA tier (marker ``gpu``): every registered encoding in a ViT and in the detector, on CUDA against the CPU.

* float32 (TF32 off): CUDA's tokens, logits, boxes equal the CPU's within rtol = atol = 1e-4, on a padded,
  non-square batch (ViT: 6 x 10 patches, a class and a register token; detector: 4 x 6 cells, every design);
* bf16 autocast against float32 on CUDA: relative error at most ``BF16_REL`` (tests/gpu_cases.py says how it
  was set), with the position math itself in float32: each encoding's tables, angles, rotations and biases
  computed under CUDA autocast are the float32 ones, bit for bit.

Skipped without a CUDA GPU, with one line saying why (tests/conftest.py); ``pytest -m gpu`` runs the tier.
"""
from __future__ import annotations

import pytest
import torch
from gpu_cases import (
    BF16_REL,
    ENCODINGS,
    bf16_error,
    detector,
    detector_batch,
    detector_cases,
    detector_outputs,
    family,
    parity,
    skip_reason,
    vit,
    vit_batch,
    vit_outputs,
)

from vispe.kernels.rope_blocks import rotations_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]
DETECTORS = detector_cases()
DET_IDS = [f"{pe}-{design}-{op}" for pe, design, op in DETECTORS]


@pytest.mark.parametrize("name", ENCODINGS)
def test_vit_on_cuda_equals_cpu_in_float32(name):
    used = parity(lambda: vit(name), vit_batch, vit_outputs, "cuda")
    assert used <= 1.0, f"{name}: CUDA differs from the CPU by {used:.2f}x the 1e-4 tolerance"


@pytest.mark.parametrize("case", DETECTORS, ids=DET_IDS)
def test_detector_on_cuda_equals_cpu_in_float32(case):
    used = parity(lambda: detector(*case), detector_batch, detector_outputs, "cuda")
    assert used <= 1.0, f"{case}: CUDA differs from the CPU by {used:.2f}x the 1e-4 tolerance"


@pytest.mark.parametrize("name", ENCODINGS)
def test_vit_bf16_autocast_within_the_bound(name):
    err = bf16_error(lambda: vit(name), vit_batch, vit_outputs, "cuda")
    assert err <= BF16_REL, f"{name}: bf16 autocast relative error {err:.3g} > {BF16_REL}"


@pytest.mark.parametrize("case", DETECTORS, ids=DET_IDS)
def test_detector_bf16_autocast_within_the_bound(case):
    err = bf16_error(lambda: detector(*case), detector_batch, detector_outputs, "cuda")
    assert err <= BF16_REL, f"{case}: bf16 autocast relative error {err:.3g} > {BF16_REL}"


def position_math(pe, shape, mask, device) -> list[torch.Tensor]:
    """What encoding ``pe`` computes for a grid, asked for float32: additive codes, rotary angles or block
    rotations, bias tensors and relative tables (a conditional encoding convolves features: none here)."""
    fam = pe.family
    if fam == "additive":
        return [pe(shape, mask, device=device, dtype=torch.float32)]
    if fam == "rotary":
        if getattr(pe, "block_size", 2) > 2:
            return [rotations_for(pe, shape, mask, 1, device)]
        return [pe(shape, mask, device=device)]
    if fam == "bias":
        N = shape[0] * shape[1] + pe.num_prefix_tokens
        g = torch.Generator().manual_seed(3)
        kw = {"q": torch.randn(mask.shape[0], pe.num_heads, N, 16, generator=g).to(device)} if pe.contextual else {}
        rel = pe.relative(shape, device=device)
        return [pe(shape, mask, device=device, dtype=torch.float32, **kw)] + ([rel[0]] if rel is not None else [])
    return []


FLOAT32_MATH = [n for n in ENCODINGS if family(n) not in ("conditional", "none")]


@pytest.mark.parametrize("name", FLOAT32_MATH)
def test_position_math_is_float32_under_cuda_autocast(name):
    check_float32_position_math(name, "cuda")


def check_float32_position_math(name: str, device) -> int:
    """Every table, angle and rotation the ViT's encoding computes under bf16 autocast on ``device`` is
    float32 and equals the one computed without autocast (the cache cleared in between, so both are
    computed); a contextual bias (relpos_decomposed: the queries times its tables) to ``BF16_REL``, since its
    product with the queries is attention math, which autocast runs in bf16. Returns how many were compared."""
    model = vit(name).to(device)
    pes = [m for m in model.modules() if getattr(m, "registry_name", "") == name]
    assert pes, f"no {name} encoding found in the model"
    _, mask = vit_batch(device)
    grid_mask = mask[:, ::4, ::4]  # (B, 6, 10): the patch grid's mask (whole padded patches)
    compared = 0
    for pe in pes:
        pe._cache.clear()
        want = position_math(pe, (6, 10), grid_mask, device)
        pe._cache.clear()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            got = position_math(pe, (6, 10), grid_mask, device)
        assert len(got) == len(want) > 0, name
        for a, b in zip(got, want):
            assert a.dtype == torch.float32, f"{name}: {a.dtype} under autocast"
            if getattr(pe, "contextual", False):  # a product with the queries, which autocast runs in bf16
                torch.testing.assert_close(a, b, rtol=BF16_REL, atol=BF16_REL)
            else:
                assert torch.equal(a, b), f"{name}: not the float32 result under autocast"
            compared += 1
    return compared
