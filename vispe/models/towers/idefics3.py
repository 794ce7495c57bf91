"""Idefics3's vision tower (transformers' ``Idefics3VisionTransformer``, SigLIP with NaViT's positions;
SmolVLM's too) converted to vispe: ``convert_vit(model)``.

Its position convention (``Idefics3VisionEmbeddings``; NaViT, Dehghani et al., 2023): a learned (N, N)
table, N = image_size / patch_size; an image padded into the batch (``patch_attention_mask`` (B, h, w),
True on its patches, a top-left rectangle of n_h x n_w) reads, at patch (i, j), the row
``bucket(i / n_h) * N + bucket(j / n_w)``, each fractional coordinate (the cell's top-left corner)
bucketed into N equal buckets; padded patches read row 0. In vispe that is ``learned_abs(
interpolation="bucket", mask_aware=True, pad_value="first")`` (the image's first vector is row 0).

The converted tower (``Idefics3VisionTower``) keeps the original's modules (patch convolution, norms,
MLPs, post-norm: copied; the original is left untouched) with vispe's ``Attention`` (q, k, v fused)
and runs the (B, h, w) patch grid as it is: padded patches are hidden as keys (as the original's
attention mask), the encoding takes the mask. It returns ``BaseModelOutputWithPooling``
(``last_hidden_state`` (B, h*w, C), every patch including padded ones; ``hidden_states`` with
``output_hidden_states``; ``return_dict=False`` a tuple). Any other vispe encoding runs by name.
Which path runs (``tower.path``, ``_packed``): ``"auto"`` and ``"canvas"`` run the (B, h, w) grid as above,
every patch as the original (padded ones too). ``"packed"`` (opt-in) takes each image's rectangle only,
groups the images by size and runs each group without padding (each image on its own grid: what it
gives alone), so it costs the valid patches; padded patches are zero in ``last_hidden_state`` (the
original gives them outputs of their own; the valid ones are equal).
Refused, naming the part: a ``patch_attention_mask`` whose patches are not a top-left rectangle (the
original counts them on the first row and column), attention weights.
"""
from __future__ import annotations

import copy

import torch

from vispe.attention import PosContext
from vispe.models.towers import register_tower
from vispe.models.towers._common import Tower, model_output, output_flags
from vispe.models.towers._packed import choose_path, group_frames, run_packed
from vispe.models.towers.siglip2 import siglip_blocks

NATIVE = dict(interpolation="bucket", mask_aware=True, pad_value="first")


class Idefics3VisionTower(Tower):
    """Idefics3's vision tower with vispe attention and encodings (module docstring)."""

    def __init__(self, original) -> None:
        super().__init__()
        cfg = original.config
        self.config = copy.deepcopy(cfg)
        emb = original.embeddings
        self.patch_embedding = copy.deepcopy(emb.patch_embedding)  # Conv2d, stride = patch
        n = int(emb.num_patches_per_side)
        self.pe_grid = (n, n)
        self.blocks = siglip_blocks(original.encoder.layers)
        self.post_layernorm = copy.deepcopy(original.post_layernorm)
        self.train(original.training)

    def native_pe(self) -> tuple[str, dict]:
        return "learned_abs", dict(NATIVE)

    def _mask(self, patch_attention_mask, B: int, shape) -> torch.Tensor | None:
        """The padding mask (B, h, w), True = padding, or None; refuses what the original cannot mean."""
        if patch_attention_mask is None:
            return None
        m = patch_attention_mask
        if not isinstance(m, torch.Tensor) or tuple(m.shape) != (B, *shape):
            got = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
            raise ValueError(f"patch_attention_mask has shape {got}: expected ({B}, {shape[0]}, {shape[1]}), True on "
                             "each image's patches")
        valid = m.bool()
        nh, nw = valid[:, :, 0].sum(1), valid[:, 0, :].sum(1)  # (B,) the original's counts
        rect = (torch.arange(shape[0], device=m.device)[None, :, None] < nh[:, None, None]) & \
               (torch.arange(shape[1], device=m.device)[None, None, :] < nw[:, None, None])  # (B, h, w)
        bad = (rect != valid).flatten(1).any(1) | (nh == 0)
        if bad.any():
            raise ValueError(f"patch_attention_mask[{int(bad.nonzero()[0])}]: expected its patches to fill a top-left "
                             "rectangle (Idefics3 counts them on the first row and column), at least one patch")
        return ~valid if not valid.all() else None

    def forward(self, pixel_values: torch.Tensor, patch_attention_mask: torch.Tensor | None = None, **kwargs):
        """The original's call -> ``BaseModelOutputWithPooling`` as the original returns it (module docstring)."""
        hidden, return_dict = output_flags(self.config, kwargs, type(self).__name__)
        x = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))  # (B, C, h, w)
        B, C, h, w = x.shape
        mask = self._mask(patch_attention_mask, B, (h, w))
        sizes = [(h, w)] * B if mask is None else [(int(a), int(b)) for a, b in
                                                   zip((~mask[:, :, 0]).sum(1).tolist(), (~mask[:, 0, :]).sum(1).tolist())]
        self.last_path = "canvas" if self.path == "auto" else choose_path(self.path, sizes)
        states = [] if hidden else None
        if self.last_path == "packed":
            return self._forward_packed(x, sizes, mask, hidden, return_dict)
        x, pos = self.input_code(x.flatten(2).transpose(1, 2), (h, w), mask)  # (B, h*w, C)
        x = self.run_blocks(x, PosContext((h, w), 0, mask, pos), on_state=states.append if hidden else None)
        last = self.post_layernorm(x)
        return model_output("BaseModelOutputWithPooling", return_dict, last_hidden_state=last,
                            hidden_states=tuple(states) if hidden else None)

    def _forward_packed(self, x: torch.Tensor, sizes, mask, hidden: bool, return_dict: bool):
        """Each image's rectangle only, grouped by size (module docstring); padded patches 0."""
        B, C, h, w = x.shape
        groups, start = group_frames(sizes)
        src = torch.empty(sum(a * b for a, b in sizes), dtype=torch.long, device=x.device)  # (T,) row -> patch
        for i, (a, b) in enumerate(sizes):
            cells = torch.arange(a, device=x.device)[:, None] * w + torch.arange(b, device=x.device)  # (a, b) raster
            src[start[i]:start[i] + a * b] = i * h * w + cells.flatten()
        flat = x.flatten(2).transpose(1, 2).reshape(B * h * w, C)  # (B*h*w, C)
        out, seen = run_packed(self, flat[src], groups, keep_states=hidden)  # (T, C)
        back = lambda v: x.new_zeros(B * h * w, C).index_copy(0, src, v).view(B, h * w, C)  # noqa: E731
        last = self.post_layernorm(back(out))  # (B, h*w, C)
        if mask is not None:
            last = last * ~mask.reshape(B, -1, 1)  # padded patches: 0
        return model_output("BaseModelOutputWithPooling", return_dict, last_hidden_state=last,
                            hidden_states=tuple(back(v) for v in seen) if hidden and seen else None)


@register_tower("transformers", "Idefics3VisionTransformer")
def convert_idefics3(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                     peg_blocks=(0,), keep_abs_pos: bool | None = None) -> Idefics3VisionTower:
    """An ``Idefics3VisionTower`` with the weights of transformers' ``Idefics3VisionTransformer`` (module
    docstring); ``pe=None`` keeps its table (``learned_abs`` with NaViT's buckets), another name replaces it."""
    if keep_abs_pos is not None:
        raise ValueError(f"keep_abs_pos={keep_abs_pos!r}: Idefics3 has one position encoding, its learned table "
                         "(pe=None keeps it, pe='learned_abs' takes it over)")
    tower = Idefics3VisionTower(model)
    tower.setup_pe(pe, pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks)
    if tower.pe_name == "learned_abs":
        table = model.embeddings.position_embedding.weight.detach()  # (N*N, C), row-major
        tower.pe.load_state_dict({"pos_embed": table[None], "table_grid": torch.tensor(tower.pe_grid)})
    return tower
