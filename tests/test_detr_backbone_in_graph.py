"""``DETR.backbone_in_graph`` (issue 39): off, torch.compile leaves the backbone out of the graph (it runs
eagerly, as Inductor fails on its convolutions at symbolic sizes); on, dynamo traces the backbone's
convolutions into the detector's graph, and the outputs are the eager model's. Traced with a backend that
only records the graphs (no Inductor: seconds); bench/compile_step.py times the Inductor-compiled step."""
from __future__ import annotations

import torch

from vispe.models.detr import create_detr


def _convs_traced(model, images, mask) -> tuple[int, dict]:
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(model, backend=record, dynamic=False)(images, mask)
    convs = sum(1 for gm in graphs for n in gm.graph.nodes if n.op == "call_function" and "conv2d" in str(n.target))
    return convs, out


def test_the_backbone_joins_the_graph_only_when_asked():
    torch.manual_seed(0)
    model = create_detr(3, backbone="small_cnn", backbone_widths=(4, 8), pe="sine", d_model=16, nheads=2,
                        enc_layers=1, dec_layers=1, dim_feedforward=16, num_queries=3, decoder="dab",
                        box_bias="boxrpb").eval()
    images = torch.randn(2, 3, 24, 40)
    mask = torch.zeros(2, 24, 40, dtype=torch.bool)
    mask[1, :, 32:] = True  # (B, H, W), the second image padded on the right
    with torch.no_grad():
        want = model(images, mask)
        outside, got_outside = _convs_traced(model, images, mask)
        model.backbone_in_graph = True
        inside, got_inside = _convs_traced(model, images, mask)
    backbone_convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.backbone.modules())
    assert backbone_convs >= 2
    assert inside - outside == backbone_convs, (inside, outside)  # the input projection is in both
    for got in (got_outside, got_inside):
        for k in ("pred_logits", "pred_boxes"):
            torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)
