"""vispe.kernels.explain reports the kernel torch ran, cross-checked with torch's own selection."""
import pytest
import torch
from torch.nn.attention import SDPBackend

from vispe.kernels import set_impl
from vispe.kernels.explain import explain, main
from vispe.models.vit import create_vit

NAMES = {SDPBackend.FLASH_ATTENTION.value: "flash", SDPBackend.EFFICIENT_ATTENTION.value: "efficient",
         SDPBackend.MATH.value: "math", SDPBackend.CUDNN_ATTENTION.value: "cudnn"}


def _vit(pe):
    torch.manual_seed(0)
    return create_vit("vit_pico", pe=pe, img_size=16, patch_size=4, num_classes=3, depth=2)


def test_kernels_match_torchs_own_choice():
    x = torch.randn(2, 3, 16, 16)
    q = torch.randn(2, 4, 17, 16)
    learned = torch.randn(1, 4, 17, 17, requires_grad=True)
    m = _vit("relbias").eval()
    with torch.no_grad():  # a bias without gradient: SDPA's own choice for a constant float mask
        rows = explain(m, x)
        want = NAMES[torch._fused_sdp_choice(q, q, q, attn_mask=learned.detach())]
    assert [r.layer for r in rows] == ["blocks.0.attn", "blocks.1.attn"]
    assert [r.kernel for r in rows] == [want, want]
    m.train()
    set_impl(m, bias="reference")  # a bias with gradient in SDPA: its choice is the math kernel
    want = NAMES[torch._fused_sdp_choice(q, q, q, attn_mask=learned)]
    assert want == "math"
    rows = explain(m, x, backward=True)
    assert [r.kernel for r in rows] == [want, want]
    assert all("SafeSoftmaxBackward0" in r.backward for r in rows)  # math's backward: its decomposition
    set_impl(m, bias="auto")  # vispe's function, whose forward runs the fused kernel
    rows = explain(m, x, backward=True)
    assert [r.kernel for r in rows] == ["chunked+flash"] * 2
    assert all(r.backward == ["BiasedAttentionBackward"] for r in rows)


def test_rope_layers_stay_on_the_fused_kernel_with_a_padding_mask(capsys):
    m = _vit("rope_mixed").train()
    mask = torch.zeros(2, 16, 16, dtype=torch.bool)
    mask[1, :, 12:] = True
    rows = explain(m, torch.randn(2, 3, 16, 16), backward=True, mask=mask)
    assert [r.kernel for r in rows] == ["flash", "flash"]
    assert all(r.backward == ["ScaledDotProductFlashAttentionForCpuBackward0"] for r in rows)
    main(["--model", "vit_pico", "--pe", "none", "--img-size", "16"])
    out = capsys.readouterr().out
    assert "blocks.0.attn" in out and "flash" in out


def test_a_model_without_attention_layers_is_refused():
    with pytest.raises(ValueError, match="no attention layer"):
        explain(torch.nn.Linear(2, 2), torch.randn(1, 2))
