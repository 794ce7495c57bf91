"""A converted RoPE tower (Pixtral's, 2D RoPE with the even/odd frequency split) exported to ONNX and
run by onnxruntime, and compiled, at two sizes (one non-square) against eager. onnxruntime's fused
rotary op broke Pixtral's 2D RoPE elsewhere (cosine 0.014 against transformers, onnxruntime
mobius#151); vispe exports real cos/sin arithmetic, which it runs as written."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import load_compare_script
from vispe.models.vit import convert_vit

pt = load_compare_script("parity_towers")
SIZES = [(4, 6), (5, 3)]  # patch grids; the first is the export example


@pytest.fixture(scope="module")
def tower():
    return convert_vit(pt.TOWERS["pixtral"].build("tiny")).eval()


@pytest.mark.slow
def test_onnx_export_runs_at_two_sizes(tower):
    pytest.importorskip("onnxruntime")
    from vispe.export import example_input, export_onnx, onnx_session, run_onnx

    program = export_onnx(tower, example=example_input(tower, grid=SIZES[0]))
    sess = onnx_session(program)
    ep = program.exported_program.module()
    for h, w in SIZES:
        x = torch.randn(2, 3, 4 * h, 4 * w)
        with torch.no_grad():
            want = tower(x).last_hidden_state  # (1, 2*h*w, C)
            torch.testing.assert_close(ep(x).last_hidden_state, want, rtol=0, atol=1e-5)
        torch.testing.assert_close(run_onnx(sess, x), want, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_compiles_without_graph_breaks_at_two_sizes_with_grad(tower):
    """``fullgraph=True`` (a graph break is an error), symbolic sizes from the first call, the
    gradient of the input against eager; ``aot_eager`` (capture + AOT autograd, no code generation)
    keeps it to ~20 s on a shared 2-core CPU."""
    torch._dynamo.reset()
    compiled = torch.compile(tower, backend="aot_eager", fullgraph=True, dynamic=True)
    for h, w in SIZES:
        x = torch.randn(2, 3, 4 * h, 4 * w, requires_grad=True)
        out, want = compiled(x).last_hidden_state, tower(x).last_hidden_state
        torch.testing.assert_close(out, want, rtol=0, atol=1e-5)
        g_c, = torch.autograd.grad(out.square().sum(), x)
        g_e, = torch.autograd.grad(want.square().sum(), x)
        torch.testing.assert_close(g_c, g_e, rtol=1e-3, atol=1e-4)
