"""torch.compile of a ViT with every encoding (CPU; slow).

Inductor (the real compiler) for one encoding of each family, ``aot_eager`` (dynamo capture plus
AOT autograd, no code generation) for the others, forward and backward, against eager.
"""
import pytest
import torch

import vispe
from vispe.models.vit import create_vit

INDUCTOR = ["learned_abs", "sine", "rope_mixed", "relbias", "peg"]


def _model(pe):
    torch.manual_seed(0)
    return create_vit("vit_pico", pe=pe, embed_dim=32, depth=1, num_heads=2, img_size=16, patch_size=4,
                      num_classes=3)


@pytest.mark.slow
@pytest.mark.parametrize("pe", [n for n in vispe.available() if n not in ("liere", "comrope", "string", "lookhere")])
def test_compiled_vit_matches_eager(pe):  # issue 38's four: one model, tests/test_image_rotary_blocks.py
    torch._dynamo.reset()
    m = _model(pe).train(False)
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    compiled = torch.compile(m, backend="inductor" if pe in INDUCTOR else "aot_eager")
    out = compiled(x)
    torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-4)
    g_c, = torch.autograd.grad(out.square().sum(), x)
    g_e, = torch.autograd.grad(m(x).square().sum(), x)
    torch.testing.assert_close(g_c, g_e, rtol=1e-3, atol=1e-4)


SIZES = [(16, 16), (24, 20)]  # the second non-square: a new grid for every encoding


def _grads(m, out):
    params = [p for p in m.parameters() if p.requires_grad]
    return torch.autograd.grad(out.square().sum(), params)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [None, True], ids=["default", "dynamic"])
@pytest.mark.parametrize("pe", ["sine", "relbias", "rope_axial", "rope_mixed"])
def test_inductor_compiled_vit_at_a_second_size_and_in_eval(pe, dynamic):
    """torch.compile(vit) (Inductor) trains at one size and then another (the default recompiles with
    symbolic sizes at the second; dynamic=True is symbolic from the first), forward and every
    parameter's gradient against eager; then (default options) evaluates under no_grad at the second
    size and another batch. About 1-2 min each on a shared 2-core CPU."""
    torch._dynamo.reset()
    m = _model(pe).train()
    compiled = torch.compile(m, dynamic=dynamic)
    for size in SIZES:
        x = torch.randn(2, 3, *size)
        out, want = compiled(x), m(x)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        for g_c, g_e in zip(_grads(m, out), _grads(m, want)):
            torch.testing.assert_close(g_c, g_e, rtol=1e-3, atol=1e-4)
    if dynamic:  # the eval graph is another compile: once (below) is enough for the suite's time
        return
    m.eval()
    with torch.no_grad():
        x = torch.randn(3, 3, *SIZES[1])
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
