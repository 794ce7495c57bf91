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
@pytest.mark.parametrize("pe", vispe.available())
def test_compiled_vit_matches_eager(pe):
    torch._dynamo.reset()
    m = _model(pe).train(False)
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    compiled = torch.compile(m, backend="inductor" if pe in INDUCTOR else "aot_eager")
    out = compiled(x)
    torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-4)
    g_c, = torch.autograd.grad(out.square().sum(), x)
    g_e, = torch.autograd.grad(m(x).square().sum(), x)
    torch.testing.assert_close(g_c, g_e, rtol=1e-3, atol=1e-4)
