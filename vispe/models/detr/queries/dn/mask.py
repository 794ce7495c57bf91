"""The self-attention mask of DINO's denoising groups (IDEA-Research/DINO ``prepare_for_cdn``'s
``attn_mask``; DN-DETR's "attention mask", Li et al., CVPR 2022).

Queries are ``[denoising groups (pad_size) | matching queries (num_queries)]``, ``num_groups`` groups
of ``pad_size / num_groups`` consecutive queries each. True = may not attend (``nn.MultiheadAttention``'s
convention; ``scaled_dot_product_attention`` and ``vispe.attention.Attention`` take ``~mask``):

* a matching query sees no denoising query (they would read the ground truth);
* a denoising query sees the queries of its own group and every matching query, no other group.
"""
from __future__ import annotations

import torch


def dn_attention_mask(pad_size: int, num_groups: int, num_queries: int, device=None) -> torch.Tensor:
    """(pad_size + num_queries)^2 bool, True = blocked (module docstring).  # (T, T)"""
    if num_groups < 1 or pad_size < 0 or pad_size % num_groups:
        raise ValueError(f"pad_size={pad_size}, num_groups={num_groups}: expected num_groups >= 1 dividing "
                         "pad_size >= 0")
    if num_queries < 0:
        raise ValueError(f"num_queries={num_queries}: expected a non-negative count")
    T = pad_size + num_queries
    group = torch.arange(T, device=device) // (pad_size // num_groups if pad_size else 1)  # (T,)
    dn = torch.arange(T, device=device) < pad_size  # (T,)
    other_group = dn[:, None] & dn[None, :] & (group[:, None] != group[None, :])  # (T, T)
    matching_sees_dn = ~dn[:, None] & dn[None, :]  # (T, T)
    return other_group | matching_sees_dn
