"""Shared parts of the converted vision towers (private): the block, the attention copy, the
encodings, the canvas that packed inputs are run on, and transformers' output conventions.

Packed inputs (Qwen's ``grid_thw`` sequences, Pixtral's several images in one sequence) are run the
vispe way, as NaFlex is (``vispe.models.naflex``): each image (each video frame) is put back on a
canvas of (max h, max w) patches, raster order, top-left aligned, with a padding mask on the cells
it does not fill. Attention then hides the padded keys (the original's block-diagonal attention:
one image never sees another), mask-aware encodings count positions over each image's valid area
(batch-invariant), and the outputs are gathered back into the original's token order. The token
order is the model's (merge blocks, windows, a class token last): a tower gives, for every packed
token, its canvas cell (``cells``), so tokens and their positions move together by construction.

Where the encodings go (``Tower.setup_pe``, one rule per family as in ``VispeViT``): rotary and
bias encodings one per layer (``blocks[i].attn.pe``); an additive one ``model.pe``, added to the
patch tokens right after the patch embedding (``pe_at="input"``) or to q and k in every layer
(``"every_block"``); a conditional one (PEG) ``model.pe`` after the blocks ``peg_blocks``. A tower
whose original adds a learned table next to its RoPE (Llama 4, Qwen3-VL) holds it as ``abs_pe`` (a
``learned_abs``), added to the patch tokens (and its prefix vector to the class token) before
``pe``: kept with ``pe=None``; a named ``pe`` replaces it too (``learned_abs`` takes it over) unless
``keep_abs_pos=True``, as ``vispe.models.eva`` does for EVA-02.
"""
from __future__ import annotations

import copy
import inspect

import torch
from torch import nn

from vispe import _checks
from vispe.attention import Attention, PosContext
from vispe.registry import build_in, get

PE_AT = ("input", "every_block")


def check_inv_freq(rope: nn.Module, name: str, want: torch.Tensor, head_dim: int, what: str) -> None:
    """Refuse a transformers rotary module whose ``inv_freq`` is not ``want`` (``what`` says whose
    table that is), whose ``attention_scaling`` is not 1, or whose ``head_dim`` is not a multiple
    of 4 (2D RoPE splits the pairs between y and x): ``rope_axial`` would not reproduce it."""
    got = rope.inv_freq.detach().float().cpu()
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-6, atol=0):
        raise ValueError(f"{name}.inv_freq is not {what}: rope_axial reproduces that table only")
    if float(getattr(rope, "attention_scaling", 1.0)) != 1.0:
        raise ValueError(f"{name}.attention_scaling={rope.attention_scaling}: expected 1 (cos/sin unscaled)")
    if head_dim % 4:
        raise ValueError(f"head_dim={head_dim}: expected a multiple of 4 (2D RoPE splits the pairs between h and w)")


def needs_grid(pe: str) -> bool:
    """Whether encoding ``pe`` cannot be built without a ``grid`` (a learned table's size)."""
    p = inspect.signature(get(pe)).parameters.get("grid")
    return p is not None and p.default is inspect.Parameter.empty


class TowerBlock(nn.Module):
    """Pre-norm residual block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``; the original's
    norms and MLP (copied modules), vispe's ``Attention``."""

    def __init__(self, norm1: nn.Module, attn: Attention, norm2: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp

    @classmethod
    def copy_of(cls, norm1: nn.Module, attn: Attention, norm2: nn.Module, mlp: nn.Module) -> TowerBlock:
        """A block of copies of the original's norms and MLP around ``attn`` (vispe's, already built
        from the original's projections by ``vispe_attention`` or ``fused_attention``)."""
        return cls(copy.deepcopy(norm1), attn, copy.deepcopy(norm2), copy.deepcopy(mlp))

    def forward(self, x: torch.Tensor, ctx: PosContext, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), attn_mask=attn_mask, ctx=ctx)  # (B, L, C)
        return x + self.mlp(self.norm2(x))


def vispe_attention(num_heads: int, q: nn.Linear, k: nn.Linear, v: nn.Linear, proj: nn.Linear) -> Attention:
    """vispe's ``Attention`` holding copies of separate q, k, v projections (fused into ``qkv``) and the
    output projection ``proj``. A missing bias where another projection has one is a zero bias."""
    dim = q.in_features
    has_bias = any(m.bias is not None for m in (q, k, v))
    attn = Attention(dim, num_heads, qkv_bias=has_bias, proj_bias=proj.bias is not None)
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
        if has_bias:
            attn.qkv.bias.copy_(torch.cat([m.bias if m.bias is not None else torch.zeros_like(m.weight[:, 0])
                                           for m in (q, k, v)]))
        attn.proj.weight.copy_(proj.weight)
        if proj.bias is not None:
            attn.proj.bias.copy_(proj.bias)
    return attn.to(device=q.weight.device, dtype=q.weight.dtype)


def fused_attention(num_heads: int, qkv: nn.Linear, proj: nn.Linear) -> Attention:
    """vispe's ``Attention`` holding copies of a fused ``qkv`` projection (rows q, k, v) and ``proj``."""
    q, k, v = (nn.Linear(qkv.in_features, qkv.out_features // 3, bias=qkv.bias is not None) for _ in range(3))
    with torch.no_grad():
        for i, m in enumerate((q, k, v)):
            rows = slice(i * m.out_features, (i + 1) * m.out_features)
            m.weight.copy_(qkv.weight[rows])
            if qkv.bias is not None:
                m.bias.copy_(qkv.bias[rows])
    return vispe_attention(num_heads, q, k, v, proj)


def to_canvas(x: torch.Tensor, cells: torch.Tensor, frames: int, shape: tuple[int, int]):
    """Packed tokens ``x`` (T, C) onto a canvas of ``frames`` images of ``shape`` (h, w): token t goes to
    flat cell ``cells[t]`` (frame * h*w + y * w + x). Returns the canvas (S, h*w, C) and its padding mask
    (S, h, w), True on cells no token fills (None when every cell is filled)."""
    h, w = shape
    canvas = x.new_zeros(frames * h * w, x.shape[-1]).index_copy(0, cells, x)  # (S*h*w, C)
    if cells.shape[0] == frames * h * w:
        return canvas.reshape(frames, h * w, -1), None
    pad = torch.ones(frames * h * w, dtype=torch.bool, device=x.device).index_fill(0, cells, False)  # (S*h*w,)
    return canvas.reshape(frames, h * w, -1), pad.reshape(frames, h, w)


def from_canvas(canvas: torch.Tensor, cells: torch.Tensor, num_prefix_tokens: int = 0) -> torch.Tensor:
    """The tokens at flat ``cells`` (T,) of a canvas (S, P + h*w, C), prefix tokens skipped.  # (T, C)"""
    grid = canvas[:, num_prefix_tokens:] if num_prefix_tokens else canvas
    return grid.reshape(-1, canvas.shape[-1])[cells]


class Tower(nn.Module):
    """Base of the converted towers: ``blocks`` (``TowerBlock``), the encodings and the block loop.

    Subclasses build ``blocks`` and call ``setup_pe``; ``native_pe()`` names the original's own
    encoding. ``pe_name``, ``pe_family``, ``pe_kwargs`` say which encoding runs.
    """

    num_prefix_tokens = 0
    #: the (h, w) grid given to encodings with learned tables (None: the tower has no native size)
    pe_grid: tuple[int, int] | None = None
    #: which path a packed batch of mixed sizes takes: "auto", "packed" or "canvas" (``_packed``)
    path = "auto"
    #: the path the last call took ("packed" or "canvas"; None before the first call)
    last_path: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.abs_pe = None  # the original's learned absolute table next to its RoPE (a learned_abs), or None

    def native_pe(self) -> tuple[str, dict]:
        raise NotImplementedError

    def setup_pe(self, pe: str | None, pe_kwargs: dict | None = None, *, pe_at: str = "input",
                 peg_blocks=(0,), keep_abs_pos: bool | None = None) -> None:
        """Put encoding ``pe`` (None: the original's own, ``native_pe()``) in the tower (module docstring)."""
        if keep_abs_pos is not None and self.abs_pe is None:
            raise ValueError(f"keep_abs_pos={keep_abs_pos!r}: this {type(self).__name__} has no absolute table")
        if keep_abs_pos is not None and not isinstance(keep_abs_pos, bool):
            raise ValueError(f"keep_abs_pos={keep_abs_pos!r}: expected True, False or None")
        if pe is None and keep_abs_pos is False:
            raise ValueError("keep_abs_pos=False with pe=None: the model's own encodings are its RoPE and its table; "
                             "name an encoding to drop the table")
        self._setup_pe(pe, pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks)
        table = self.abs_pe
        if pe is not None and table is not None and not keep_abs_pos:
            if pe == "learned_abs":  # the table moves into the named encoding, resampled to its grid
                with torch.no_grad():
                    self.pe.pos_embed.copy_(table._resampled(self.pe.table_grid()))
                    if self.pe.prefix_embed is not None and table.prefix_embed is not None:
                        self.pe.prefix_embed.copy_(table.prefix_embed)
            self.abs_pe = None

    def _setup_pe(self, pe: str | None, pe_kwargs: dict | None, *, pe_at: str, peg_blocks) -> None:
        pe_kwargs = dict(pe_kwargs or {})
        if pe is None:
            pe, native = self.native_pe()
            pe_kwargs = {**native, **pe_kwargs}
        family = get(pe).family
        self.pe_name, self.pe_family, self.pe_kwargs = pe, family, pe_kwargs
        self.pe_at = _checks.choice("pe_at", pe_at, PE_AT)
        if pe_at == "every_block" and family != "additive":
            raise ValueError(f"pe_at='every_block' applies to additive encodings; {pe!r} is {family}")
        self.peg_blocks = tuple(peg_blocks)
        for i in self.peg_blocks:
            if not isinstance(i, int) or not 0 <= i < len(self.blocks):
                raise ValueError(f"peg_blocks={peg_blocks!r}: expected block indices in [0, {len(self.blocks)})")
        attn = self.blocks[0].attn
        if self.pe_grid is None and "grid" not in pe_kwargs and needs_grid(pe):
            raise ValueError(f"pe={pe!r} needs the grid its table is made for, and this {type(self).__name__}'s config "
                             "names none (it takes images of any size): pass pe_kwargs={'grid': (h, w)}, in patches")
        context = dict(dim=attn.qkv.in_features, num_heads=attn.num_heads, head_dim=attn.head_dim,
                       grid=self.pe_grid, num_prefix_tokens=self.num_prefix_tokens)
        if family == "additive" and not get(pe).learned_prefix:
            context["num_prefix_tokens"] = 0
        self.pe = None
        for blk in self.blocks:
            blk.attn.set_pe(None)
        ref = next(self.parameters())
        if family in ("additive", "conditional"):
            self.pe = build_in(pe, context, **pe_kwargs).to(device=ref.device, dtype=ref.dtype)
        elif family in ("rotary", "bias"):
            for blk in self.blocks:
                blk.attn.set_pe(build_in(pe, context, **pe_kwargs).to(device=ref.device, dtype=ref.dtype))
        elif pe_kwargs:
            raise ValueError(f"pe_kwargs={pe_kwargs!r}: the encoding {pe!r} takes no settings")

    @property
    def encoding(self):
        """The tower's encoding whatever its family: ``pe`` (additive, conditional) or the first block's
        ``attn.pe`` (rotary, bias: one per block); None for ``pe="none"``."""
        return self.pe if self.pe is not None else self.blocks[0].attn.pe

    def no_weight_decay(self) -> set[str]:
        """Every parameter of the encodings (tables, frequencies, prefix vectors)."""
        return {n for n, _ in self.named_parameters() if n.startswith(("pe.", "abs_pe.")) or ".attn.pe." in n}

    def input_code(self, x: torch.Tensor, shape, mask) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Grid tokens ``x`` (S, h*w, C) with an additive ``pe`` added (``pe_at="input"``), and the
        per-layer code ``pos`` (S|1, P + h*w, C) of ``pe_at="every_block"`` (else None)."""
        if self.abs_pe is not None:
            x = x + self.abs_pe(shape, mask, device=x.device, dtype=x.dtype)  # (S, h*w, C)
        if self.pe_family != "additive":
            return x, None
        code = self.pe(shape, mask, device=x.device, dtype=x.dtype)  # (S|1, h*w, C)
        if self.pe_at == "input":
            return x + code, None
        P = self.num_prefix_tokens
        pre = self.pe.prefix(device=x.device, dtype=x.dtype)
        pre = code.new_zeros(1, P, code.shape[-1]) if pre is None else pre  # (1, P, C)
        return x, torch.cat([pre.expand(code.shape[0], -1, -1), code], dim=1)  # (S|1, P+h*w, C)

    def prefix_code(self, dtype, device) -> torch.Tensor | None:
        """The learned prefix vectors (1, P, C) of ``abs_pe`` and an additive input ``pe``, or None."""
        codes = [e.prefix(device=device, dtype=dtype) for e in (self.abs_pe, self.pe)
                 if e is not None and getattr(e, "family", "") == "additive" and (e is self.abs_pe or self.pe_at == "input")]
        codes = [c for c in codes if c is not None]
        return sum(codes[1:], codes[0]) if codes else None

    def run_blocks(self, x: torch.Tensor, ctx: PosContext, attn_masks: dict | None = None, on_state=None,
                   on_block=None):
        """The blocks over the canvas ``x`` (S, P + h*w, C), or a packed sequence (1, T, C) with ``ctx.segments``
        (``_packed.run_packed``); ``attn_masks`` {block index: SDPA mask, or one per segment}
        (window attention); ``on_state(x)`` is called with the input and every block's output,
        ``on_block(i, x)`` with block i's output."""
        attn_masks = attn_masks or {}
        if on_state is not None:
            on_state(x)
        for i, blk in enumerate(self.blocks):
            x = blk(x, ctx, attn_mask=attn_masks.get(i))
            if self.pe_family == "conditional" and i in self.peg_blocks:
                x = self._apply_peg(x, ctx)
            if on_state is not None:
                on_state(x)
            if on_block is not None:
                on_block(i, x)
        return x

    def _apply_peg(self, x: torch.Tensor, ctx: PosContext) -> torch.Tensor:
        if ctx.segments is not None:  # a packed sequence (1, T, C): the PEG per segment, on its frames' grid
            parts = x[0].split([s.frames * s.length for s in ctx.segments])
            return torch.cat([self._apply_peg(p.reshape(s.frames, s.length, -1), s.ctx).reshape(-1, x.shape[-1])
                              for p, s in zip(parts, ctx.segments)])[None]  # (1, T, C)
        P, (h, w) = ctx.num_prefix_tokens, ctx.shape
        grid = x[:, P:].transpose(1, 2).reshape(x.shape[0], -1, h, w)  # (S, C, h, w)
        grid = grid + self.pe(grid, ctx.mask)
        return torch.cat([x[:, :P], grid.flatten(2).transpose(1, 2)], dim=1)  # (S, P+h*w, C)


def output_flags(config, kwargs: dict, name: str) -> tuple[bool, bool]:
    """``(output_hidden_states, return_dict)`` of a call, transformers' defaults from ``config``;
    anything else a transformers tower takes is refused, naming it."""
    kwargs = dict(kwargs)
    hidden = kwargs.pop("output_hidden_states", None)
    return_dict = kwargs.pop("return_dict", None)
    attentions = kwargs.pop("output_attentions", None)
    if kwargs:
        raise ValueError(f"{', '.join(sorted(kwargs))}: the converted {name} computes positions, windows and "
                         "sequence lengths from its inputs; expected only output_hidden_states and return_dict")
    if attentions:
        raise ValueError("output_attentions=True: vispe's attention runs on fused SDPA and keeps no attention "
                         "weights; expected output_attentions=False or None")
    hidden = getattr(config, "output_hidden_states", False) if hidden is None else hidden
    if not isinstance(hidden, bool):
        raise ValueError(f"output_hidden_states={hidden!r}: expected True or False (selecting layers by index "
                         "is not supported)")
    return_dict = getattr(config, "return_dict", True) if return_dict is None else return_dict
    return hidden, bool(return_dict)


def model_output(cls, return_dict: bool, **fields):
    """transformers' output ``cls`` (a class, or a name in ``transformers.modeling_outputs``) with
    ``fields``, or its tuple."""
    if isinstance(cls, str):
        from transformers import modeling_outputs

        cls = getattr(modeling_outputs, cls)
    out = cls(**fields)
    return out if return_dict else out.to_tuple()
