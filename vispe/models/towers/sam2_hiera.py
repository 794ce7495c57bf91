"""SAM 2's image encoder (Hiera; Ryali et al., 2023; Ravi et al., 2024) converted to vispe at any
grid: transformers' ``Sam2HieraDetModel`` (and inside ``Sam2VisionModel`` / ``Sam2Model``), through
``convert_vit(model)``.

Hiera's position is one additive code after the patch embedding (Bolya et al., 2023, "Window
Attention is Bugged"): a background table ``pos_embed`` (1, C, bh, bw) resized bicubically to the
grid, plus a window table ``pos_embed_window`` (1, C, ws, ws) repeated over it. transformers repeats
the window ``h // ws`` x ``w // ws`` times, so a grid that is not a multiple of ``ws`` along an axis
fails ("size of tensor a (22) must match ... (20)"). vispe's rule: the background table is a
``learned_abs`` (``interpolation="bicubic", antialias=False``: the original's ``F.interpolate``, by
target size), and the window table is repeated from the top-left corner, one more time where the
grid needs it, and cropped (the same cells as the original wherever it runs; on any other grid each
cell still gets the window offset of its position in its attention window, since Hiera's windows are
also cut from the top-left corner).

Hiera's blocks (windowed multi-scale attention whose queries are max-pooled at stage changes) are
the original's modules, copied: they take any grid already. Another encoding replaces Hiera's by
name if it is additive (``convert_vit(hiera, pe="sincos2d")``, added after the patch embedding at
the input's grid; ``keep_abs_pos=True`` keeps Hiera's next to it); ``pe="learned_abs"`` takes Hiera's
whole code over as one table over the native grid (background resized plus windows, so at the native
size it is the original). Rotary and bias encodings are refused: they would act inside the attention,
which stays the original's (query pooling); a padding mask is not taken, for the same reason.

``forward(pixel_values, **kwargs)`` returns ``Sam2HieraDetModelOutput`` (``last_hidden_state``
(B, h', w', C'), ``intermediate_hidden_states`` at the end of each stage, ``hidden_states``).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from vispe.image.learned_abs import LearnedAbsEncoding
from vispe.models.towers import register_tower
from vispe.models.towers._common import output_flags
from vispe.registry import build_in, get


def tile_window(window: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A (1, C, ws0, ws1) window table repeated from the top-left over ``shape`` (h, w), cropped.  # (1, C, h, w)"""
    (h, w), (a, b) = shape, window.shape[-2:]
    return window.repeat(1, 1, -(-h // a), -(-w // b))[..., :h, :w]


class HieraTower(nn.Module):
    """Hiera with its position code at any grid, or another additive encoding (module docstring)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.config = copy.deepcopy(model.config)
        self.patch_embed, self.blocks = copy.deepcopy(model.patch_embed), copy.deepcopy(model.blocks)
        self.stage_ends = list(model.stage_ends)
        bg = model.pos_embed.detach()  # (1, C, bh, bw)
        C, bh, bw = bg.shape[1:]
        self.abs_pe: LearnedAbsEncoding | None = LearnedAbsEncoding(C, grid=(bh, bw), interpolation="bicubic",
                                                                    antialias=False)
        self.abs_pe.load_state_dict({"pos_embed": bg.flatten(2).transpose(1, 2), "table_grid": torch.tensor((bh, bw))})
        self.pos_embed_window: nn.Parameter | None = nn.Parameter(model.pos_embed_window.detach().clone())
        self.abs_pe.to(device=bg.device, dtype=bg.dtype)
        size = self.config.image_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        stride = self.config.patch_stride
        stride = (stride, stride) if isinstance(stride, int) else tuple(stride)
        self.pe_grid = (size[0] // stride[0], size[1] // stride[1])
        self.pe, self.pe_name = None, None  # None: Hiera's own code

    def hiera_code(self, shape: tuple[int, int], device, dtype) -> torch.Tensor:
        """Hiera's position code on an (h, w) grid: background resized + windows repeated.  # (1, h, w, C)"""
        assert self.abs_pe is not None and self.pos_embed_window is not None
        bg = self.abs_pe(shape, device=device, dtype=dtype)  # (1, h*w, C)
        win = tile_window(self.pos_embed_window.to(dtype), shape).flatten(2).transpose(1, 2)  # (1, h*w, C)
        return (bg + win).reshape(1, *shape, -1)

    def setup_pe(self, pe: str | None, pe_kwargs: dict | None = None, *, keep_abs_pos: bool | None = None) -> None:
        """Hiera's code (``pe=None``), or an additive encoding by name in its place (module docstring)."""
        if keep_abs_pos is not None and not isinstance(keep_abs_pos, bool):
            raise ValueError(f"keep_abs_pos={keep_abs_pos!r}: expected True, False or None")
        if pe is None:
            if pe_kwargs or keep_abs_pos is not None:
                raise ValueError(f"pe_kwargs={pe_kwargs!r}, keep_abs_pos={keep_abs_pos!r} with pe=None: Hiera's own "
                                 "code takes no settings")
            return
        family = get(pe).family
        if family != "additive":
            raise ValueError(f"pe={pe!r} is {family}: Hiera's attention (windows, query pooling) stays the original's "
                             "module, so only additive encodings replace its code (e.g. 'sincos2d', 'learned_abs')")
        if keep_abs_pos and pe == "learned_abs":
            raise ValueError("keep_abs_pos=True with pe='learned_abs': Hiera's code would be added twice")
        C = self.pos_embed_window.shape[1] if self.pos_embed_window is not None else self.config.hidden_size
        ref = self.patch_embed.projection.weight
        self.pe = build_in(pe, dict(dim=C, grid=self.pe_grid, num_prefix_tokens=0), **(pe_kwargs or {}))
        self.pe.to(device=ref.device, dtype=ref.dtype)
        self.pe_name = pe
        if pe == "learned_abs":
            with torch.no_grad():  # Hiera's whole code at the native grid, as one table
                self.pe.pos_embed.copy_(self.hiera_code(self.pe.table_grid(), ref.device, ref.dtype).flatten(1, 2))
        if not keep_abs_pos:
            self.abs_pe, self.pos_embed_window = None, None

    def no_weight_decay(self) -> set[str]:
        return {n for n, _ in self.named_parameters() if n.startswith(("pe.", "abs_pe.", "pos_embed_window"))}

    def forward(self, pixel_values: torch.Tensor, **kwargs):
        """``pixel_values`` (B, C, H, W) -> ``Sam2HieraDetModelOutput`` as the original returns it."""
        from transformers.models.sam2.modeling_sam2 import Sam2HieraDetModelOutput

        hidden, return_dict = output_flags(self.config, kwargs, type(self).__name__)
        x = self.patch_embed(pixel_values)  # (B, h, w, C)
        shape = tuple(x.shape[1:3])
        if self.abs_pe is not None:
            x = x + self.hiera_code(shape, x.device, x.dtype)
        if self.pe is not None:
            x = x + self.pe(shape, device=x.device, dtype=x.dtype).reshape(1, *shape, -1)
        states, stages = [x], []
        for i, blk in enumerate(self.blocks):
            x = blk(x)  # (B, h_i, w_i, C_i)
            states.append(x)
            if i in self.stage_ends:
                stages.append(x)
        out = Sam2HieraDetModelOutput(last_hidden_state=x, intermediate_hidden_states=tuple(stages),
                                      hidden_states=tuple(states) if hidden else None)
        return out if return_dict else out.to_tuple()


def _refuse_attention_args(pe_at, peg_blocks) -> None:
    if pe_at != "input" or tuple(peg_blocks) != (0,):
        raise ValueError(f"pe_at={pe_at!r}, peg_blocks={peg_blocks!r}: Hiera takes an additive code at the input only "
                         "(expected the defaults)")


@register_tower("transformers", "Sam2HieraDetModel")
def convert_hiera(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                  peg_blocks=(0,), keep_abs_pos: bool | None = None) -> HieraTower:
    """A ``HieraTower`` with the weights of transformers' ``Sam2HieraDetModel`` (module docstring)."""
    _refuse_attention_args(pe_at, peg_blocks)
    tower = HieraTower(model)
    tower.setup_pe(pe, pe_kwargs, keep_abs_pos=keep_abs_pos)
    return tower.train(model.training)


def _swapped(model, holder: str, pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos):
    out = copy.deepcopy(model)
    vision = out.vision_encoder if holder == "vision_encoder" else out
    vision.backbone = convert_hiera(vision.backbone, pe, pe_kwargs=pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks,
                                    keep_abs_pos=keep_abs_pos)
    return out


@register_tower("transformers", "Sam2VisionModel")
def convert_sam2_vision(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                        peg_blocks=(0,), keep_abs_pos: bool | None = None):
    """A copy of transformers' ``Sam2VisionModel`` (Hiera + FPN neck) with its Hiera converted."""
    return _swapped(model, "self", pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos)


@register_tower("transformers", "Sam2Model")
def convert_sam2_model(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                       peg_blocks=(0,), keep_abs_pos: bool | None = None):
    """A copy of transformers' ``Sam2Model`` whose vision encoder's Hiera is converted; the prompt encoder
    and mask decoder are the original's (copied)."""
    return _swapped(model, "vision_encoder", pe, pe_kwargs, pe_at, peg_blocks, keep_abs_pos)
