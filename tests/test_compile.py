"""torch.compile of a ViT with one encoding of each family (CPU inductor; slow: ~1 min)."""
import pytest
import torch

from vispe.models.vit import create_vit


@pytest.mark.slow
@pytest.mark.parametrize("pe", ["learned_abs", "sine", "rope_mixed", "relbias", "peg"])
def test_compiled_vit_matches_eager(pe):
    torch.manual_seed(0)
    m = create_vit("vit_pico", pe=pe, embed_dim=32, depth=1, num_heads=2, img_size=16, patch_size=4,
                   num_classes=3).eval()
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(m)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), m(x), rtol=1e-4, atol=1e-4)
