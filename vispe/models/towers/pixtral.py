"""Pixtral's vision encoder (transformers' ``PixtralVisionModel``) converted to vispe: ``convert_vit(model)``.

Its position convention (``PixtralVisionRotaryEmbedding``): one RoPE schedule over the full
head_dim, ``F_k = theta^(-2k/head_dim)``, k < head_dim/2; the patch row h takes the even-indexed
frequencies ``F_0, F_2, ...`` and the column w the odd-indexed ones; h angles on the first
head_dim/4 channel pairs, w angles on the next, rotate-half pairing, integer indices from 0 (the
original's flat id ``h * max_width + w`` indexed a table of exactly these (h, w) angles). In vispe:
``rope_axial(base=theta, freq_split="even_odd")``.

Inputs: ``pixel_values`` (B, C, H, W), several images of different sizes padded into one batch,
and ``image_sizes`` (B, 2) of each image's (height, width) in pixels (None: every image fills the
batch). The original embeds the patches, keeps each image's ``size // patch_size`` patches, packs
them into one sequence (1, sum h_i * w_i, C) in raster order and attends within each image only
(a block-diagonal mask). The converted tower (``PixtralTower``) keeps the batch as a canvas of
(max h, max w) patches with a padding mask on each image's unused cells (so each image attends to
itself only, and mask-aware encodings count positions over its own area), and returns the same
packed ``BaseModelOutputWithPooling`` (``last_hidden_state``; ``hidden_states`` with
``output_hidden_states=True``). Without ``image_sizes`` the call has no data-dependent shape, so
it exports (``vispe.export``) and compiles at any size. Any other vispe encoding runs by name.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from vispe.attention import PosContext
from vispe.models.towers import register_tower
from vispe.models.towers._common import Tower, TowerBlock, check_inv_freq, model_output, output_flags, vispe_attention
from vispe.models.towers._packed import choose_path, group_frames, run_packed


class PatchConv(nn.Module):
    """Pixtral's patch convolution with the attributes ``vispe.export`` reads (``proj``, ``patch_size``,
    ``grid_size``).  # (B, C, H, W) -> (B, dim, H/p, W/p)"""

    def __init__(self, proj: nn.Conv2d, grid_size: tuple[int, int]) -> None:
        super().__init__()
        self.proj = proj
        self.patch_size = tuple(proj.kernel_size)
        self.grid_size = grid_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.to(self.proj.weight.dtype))


class PixtralTower(Tower):
    """Pixtral's vision encoder with vispe attention and encodings (module docstring)."""

    def __init__(self, original) -> None:
        super().__init__()
        cfg = original.config
        self.config = copy.deepcopy(cfg)
        p = int(cfg.patch_size)
        self.pe_grid = (int(cfg.image_size) // p,) * 2
        self.patch_embed = PatchConv(copy.deepcopy(original.patch_conv), self.pe_grid)
        self.ln_pre = copy.deepcopy(original.ln_pre)
        heads = int(cfg.num_attention_heads)
        self.blocks = nn.ModuleList(
            TowerBlock.copy_of(b.attention_norm,
                               vispe_attention(heads, b.attention.q_proj, b.attention.k_proj, b.attention.v_proj,
                                               b.attention.o_proj),
                               b.ffn_norm, b.feed_forward)
            for b in original.transformer.layers)
        self.theta = float(cfg.rope_parameters["rope_theta"])
        self.train(original.training)

    def native_pe(self) -> tuple[str, dict]:
        return "rope_axial", dict(base=self.theta, freq_split="even_odd")

    def _sizes(self, image_sizes, batch: int, grid: tuple[int, int]) -> list[tuple[int, int]] | None:
        """Each image's patch grid (h_i, w_i), or None when every image fills the batch."""
        if image_sizes is None:
            return None
        sizes = image_sizes.tolist() if isinstance(image_sizes, torch.Tensor) else list(image_sizes)
        if len(sizes) != batch or any(len(s) != 2 for s in sizes):
            raise ValueError(f"image_sizes={image_sizes!r}: expected {batch} (height, width) pairs, one per image")
        p = self.patch_embed.patch_size
        out = [(int(s[0]) // p[0], int(s[1]) // p[1]) for s in sizes]
        for i, (h, w) in enumerate(out):
            if not (1 <= h <= grid[0] and 1 <= w <= grid[1]):
                raise ValueError(f"image_sizes[{i}]={list(sizes[i])}: expected at least one patch "
                                 f"({p[0]} x {p[1]} px) and at most the batch's {grid[0] * p[0]} x {grid[1] * p[1]} px")
        return out

    def forward(self, pixel_values: torch.Tensor, image_sizes=None, **kwargs):
        """The original's call -> ``BaseModelOutputWithPooling`` (last_hidden_state (1, sum h_i w_i, C))."""
        hidden, return_dict = output_flags(self.config, kwargs, type(self).__name__)
        x = self.patch_embed(pixel_values)  # (B, C, h, w)
        B, C = x.shape[:2]
        sizes = self._sizes(image_sizes, B, tuple(x.shape[-2:]))
        self.last_path = choose_path(self.path, sizes or [])
        if self.last_path == "packed":
            return self._forward_packed(x, sizes or [tuple(x.shape[-2:])] * B, hidden, return_dict)
        mask = None
        if sizes is not None:
            shape = (max(h for h, _ in sizes), max(w for _, w in sizes))
            x = x[..., : shape[0], : shape[1]]
            valid = [torch.zeros(shape, dtype=torch.bool, device=x.device) for _ in sizes]
            for v, (h, w) in zip(valid, sizes):
                v[:h, :w] = True
            valid = torch.stack(valid)  # (B, h, w)
            mask = None if bool(valid.all()) else ~valid
        shape = tuple(x.shape[-2:])
        x = x.flatten(2).transpose(1, 2)  # (B, h*w, C) raster order
        x, pos = self.input_code(x, shape, mask)
        x = self.ln_pre(x)
        ctx = PosContext(shape, 0, mask, pos)

        def pack(t: torch.Tensor) -> torch.Tensor:  # (B, h*w, C) -> (1, sum h_i w_i, C), each image raster
            return (t if mask is None else t[~mask.reshape(B, -1)]).reshape(1, -1, t.shape[-1])

        states = []
        x = self.run_blocks(x, ctx, on_state=(lambda s: states.append(pack(s))) if hidden else None)
        last = pack(x)
        return model_output("BaseModelOutputWithPooling", return_dict, last_hidden_state=last,
                            hidden_states=tuple(states) if hidden else None)

    def _forward_packed(self, x: torch.Tensor, sizes, hidden: bool, return_dict: bool):
        """The packed path (``_packed``): images grouped by size, no canvas; same outputs as ``forward``'s."""
        groups, start = group_frames(sizes)
        parts = [None] * len(sizes)
        for (h, w), _ in groups:
            idx = [i for i, s in enumerate(sizes) if s == (h, w)]
            crop = x[idx, :, :h, :w].flatten(2).transpose(1, 2)  # (S_g, h*w, C) raster
            for j, i in enumerate(idx):
                parts[i] = crop[j]
        order = sorted(range(len(sizes)), key=lambda i: start[i])
        virtual = torch.cat([parts[i] for i in order])  # (T, C) grouped by size
        out, states = run_packed(self, virtual, groups, prep=self.ln_pre, keep_states=hidden)
        rows = torch.cat([torch.arange(start[i], start[i] + h * w, device=x.device) for i, (h, w) in enumerate(sizes)])

        def pack(t: torch.Tensor) -> torch.Tensor:  # virtual (T, C) -> (1, T, C), images in input order
            return t[rows][None]

        return model_output("BaseModelOutputWithPooling", return_dict, last_hidden_state=pack(out),
                            hidden_states=tuple(pack(t) for t in states) if hidden else None)


def _check_rotary(model) -> None:
    rope = model.patch_positional_embedding
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    theta = float(cfg.rope_parameters["rope_theta"])
    full = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (head_dim/2,)
    want = torch.cat([full[0::2], full[1::2]])
    check_inv_freq(rope, "patch_positional_embedding", want, head_dim,
                   f"Pixtral's even/odd split of theta^(-2k/head_dim) with rope_theta={theta:g}, head_dim={head_dim}")


@register_tower("transformers", "PixtralVisionModel")
def convert_pixtral(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                    peg_blocks=(0,), keep_abs_pos: bool | None = None) -> PixtralTower:
    """A ``PixtralTower`` with the weights of a ``PixtralVisionModel`` (module docstring); ``pe=None``
    keeps its RoPE (``rope_axial``, ``freq_split="even_odd"``), another name replaces it."""
    if float(model.config.attention_dropout):
        raise ValueError(f"attention_dropout={model.config.attention_dropout}: expected 0 (vispe copies no dropout)")
    _check_rotary(model)
    tower = PixtralTower(model)
    tower.setup_pe(pe, pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks, keep_abs_pos=keep_abs_pos)
    return tower
