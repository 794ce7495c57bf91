"""RT-DETRv2's deformable cross-attention with per-level sampling points (``MSDeformAttnV2``) against
transformers' ``multi_scale_deformable_attention_v2`` given the same points list, both sampling methods."""
import pytest
import torch
from transformers.models.rt_detr_v2.modeling_rt_detr_v2 import multi_scale_deformable_attention_v2

from vispe.kernels.deformable import Levels
from vispe.models.detr.realtime.deform_v2 import MSDeformAttnV2


def reference(attn, query, box_cxcywh, memory, shapes):
    """transformers' RTDetrV2MultiscaleDeformableAttention.forward (box reference), with a points list."""
    B, Q, d = query.shape
    M, S = attn.num_heads, sum(attn.points)
    value = attn.value_proj(memory).view(B, -1, M, d // M)
    offsets = attn.sampling_offsets(query).view(B, Q, M, S, 2)
    weights = attn.attention_weights(query).view(B, Q, M, S).softmax(-1)
    scale = torch.tensor([1 / n for n in attn.points for _ in range(n)])[:, None]
    ref = box_cxcywh[:, :, None, None]  # (B, Q, 1, 1, 4)
    loc = ref[..., :2] + offsets * scale * ref[..., 2:] * attn.offset_scale
    out = multi_scale_deformable_attention_v2(value, shapes, loc, weights, attn.points, attn.method)
    return attn.output_proj(out)


@pytest.mark.parametrize("method", ["default", "discrete"])
def test_per_level_points_equal_transformers_v2_sampling(method):
    torch.manual_seed(0)
    shapes = [(6, 8), (3, 4), (2, 2)]
    attn = MSDeformAttnV2(32, 4, 3, [2, 4, 3], offset_scale=0.6, method=method)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.5)
    levels = Levels(tuple(shapes))
    query, memory = torch.randn(2, 7, 32), torch.randn(2, levels.num_tokens, 32)
    box = torch.rand(2, 7, 4) * 0.6 + 0.2  # (cx, cy, w, h)
    reference_yx = box[..., [1, 0, 3, 2]][:, :, None].expand(-1, -1, 3, -1)  # (B, Q, L, 4) as (cy, cx, h, w)
    with torch.no_grad():
        got = attn(query, reference_yx, memory, levels)
        want = reference(attn, query, box, memory, shapes)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_discrete_differs_from_bilinear_and_options_are_checked():
    torch.manual_seed(0)
    a = MSDeformAttnV2(32, 4, 2, [3, 2])
    b = MSDeformAttnV2(32, 4, 2, [3, 2], method="discrete")
    b.load_state_dict(a.state_dict())
    levels = Levels(((5, 7), (3, 4)))
    q, m = torch.randn(1, 4, 32), torch.randn(1, levels.num_tokens, 32)
    ref = torch.rand(1, 4, 2, 4) * 0.5 + 0.25
    with torch.no_grad():
        assert (a(q, ref, m, levels) - b(q, ref, m, levels)).abs().max() > 1e-3
    with pytest.raises(ValueError, match="num_points"):
        MSDeformAttnV2(32, 4, 2, [3, 2, 1])
    with pytest.raises(ValueError, match="method='nearest'"):
        MSDeformAttnV2(32, 4, 2, 4, method="nearest")
