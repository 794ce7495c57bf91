"""Llama 4's vision encoder (transformers' ``Llama4VisionModel``) converted to vispe: ``convert_vit(model)``.

Its position convention (``Llama4VisionRotaryEmbedding``, a complex table ``freqs_ci`` for the
config's fixed square grid): 1-based coordinates ``(x + 1, y + 1)``, head_dim/4 frequencies
``theta^(-4j/head_dim)`` per axis, the x angles on the first head_dim/4 channel pairs and the y angles
on the next, interleaved pairs (``view_as_complex`` of consecutive channels), and the class token,
appended after the patches, left unrotated (its row masked to angle 0). In vispe:
``rope_axial(base=theta, axis_order="xy", layout="interleaved", offset=1)``; the 1-based offset
cancels between patches and matters against the unrotated class token. Next to it a learned table
``positional_embedding_vlm`` (grid rows, then the class token's row) is added to the tokens before
``layernorm_pre``: vispe's ``learned_abs`` on the grid with the class row as its prefix vector
(``model.abs_pe``).

The class token's place is token order, the model's: the converted tower (``Llama4Tower``) runs it
first, as every vispe model does (prefix tokens first, unrotated), and puts it back last wherever
the original shows it (``hidden_states``). Attention is permutation-equivariant and each token
keeps its angles, so the outputs are the same. Returned as the original: ``BaseModelOutputWithPooling``
whose ``last_hidden_state`` is the pixel-shuffle adapter's output, ``hidden_states`` the encoder's
(class token last) with ``output_hidden_states=True``.

Grid change: the original runs at its config's ``image_size`` only (its table and ``freqs_ci`` are
fixed); the converted tower recomputes the RoPE and resamples the table (bicubic) at any square
grid the adapter's pixel shuffle takes. ``convert_vit(model, pe=...)`` replaces the RoPE and the
table (``learned_abs`` takes the table over), unless ``keep_abs_pos=True`` keeps the table.
Which path runs (``tower.path``, ``_packed``): Llama 4's inputs are tiles of one size (B, 3, H, W), so a
batch is always one group of equal frames with no padding and no mask: the canvas path, which is
also what the packed path runs for one group (``path="packed"`` gives the same call, ``last_path``
says "packed"); ``"auto"`` says "canvas".
Refused: a non-None ``attention_mask`` (the original ignores it), attention weights, attention dropout.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from vispe.attention import PosContext
from vispe.image.learned_abs import LearnedAbsEncoding
from vispe.kernels.rope import rope_tables
from vispe.models.towers import register_tower
from vispe.models.towers._common import Tower, TowerBlock, model_output, output_flags, vispe_attention
from vispe.models.towers._packed import choose_path
from vispe.registry import build


def _llama4_rope_kwargs(theta: float) -> dict:
    return dict(base=theta, axis_order="xy", layout="interleaved", offset=1)


class Llama4Tower(Tower):
    """Llama 4's vision encoder with vispe attention and encodings (module docstring)."""

    num_prefix_tokens = 1

    def __init__(self, original) -> None:
        super().__init__()
        cfg = original.config
        self.config = copy.deepcopy(cfg)
        g = int(cfg.image_size) // int(cfg.patch_size)
        self.pe_grid = (g, g)
        self.patch_embedding = copy.deepcopy(original.patch_embedding)
        self.patch_size = int(cfg.patch_size)
        self.class_embedding = nn.Parameter(original.class_embedding.detach().clone())
        self.layernorm_pre = copy.deepcopy(original.layernorm_pre)
        self.layernorm_post = copy.deepcopy(original.layernorm_post)
        self.vision_adapter = copy.deepcopy(original.vision_adapter)
        heads = int(cfg.num_attention_heads)
        self.blocks = nn.ModuleList(
            TowerBlock.copy_of(b.input_layernorm,
                               vispe_attention(heads, b.self_attn.q_proj, b.self_attn.k_proj, b.self_attn.v_proj,
                                               b.self_attn.o_proj),
                               b.post_attention_layernorm, b.mlp)
            for b in original.model.layers)
        table = original.positional_embedding_vlm.detach()  # (g*g + 1, C): grid rows, class row last
        self.abs_pe = LearnedAbsEncoding(table.shape[-1], grid=self.pe_grid, num_prefix_tokens=1)
        with torch.no_grad():
            self.abs_pe.pos_embed.copy_(table[None, :-1])
            self.abs_pe.prefix_embed.copy_(table[None, -1:])
        self.abs_pe.to(device=table.device, dtype=table.dtype)
        self.theta = float(cfg.rope_parameters["rope_theta"])
        self.train(original.training)

    def native_pe(self) -> tuple[str, dict]:
        return "rope_axial", _llama4_rope_kwargs(self.theta)

    def forward(self, pixel_values: torch.Tensor, attention_mask=None, output_attentions=None,
                output_hidden_states=None, return_dict=None, **kwargs):
        """The original's call -> ``BaseModelOutputWithPooling`` (module docstring)."""
        if attention_mask is not None:
            raise ValueError("attention_mask is given: Llama4VisionModel ignores it (every patch attends to every "
                             "other); expected None")
        hidden, return_dict = output_flags(self.config, dict(kwargs, output_attentions=output_attentions,
                                                             output_hidden_states=output_hidden_states,
                                                             return_dict=return_dict), type(self).__name__)
        B, _, H, W = pixel_values.shape
        shape = (H // self.patch_size, W // self.patch_size)
        self.last_path = choose_path(self.path, [shape] * B)  # one size: "auto" is the canvas (module docstring)
        x = self.patch_embedding(pixel_values)  # (B, h*w, C) raster order
        cls = self.class_embedding.to(x.dtype).expand(B, 1, -1)  # (B, 1, C)
        x, pos = self.input_code(x, shape, None)  # its table (abs_pe) or another additive pe
        pre = self.prefix_code(x.dtype, x.device)
        cls = cls if pre is None else cls + pre
        x = self.layernorm_pre(torch.cat([cls, x], dim=1))  # (B, 1 + h*w, C), class token first
        ctx = PosContext(shape, 1, None, pos)
        states = []
        x = self.run_blocks(x, ctx, on_state=(lambda s: states.append(torch.cat([s[:, 1:], s[:, :1]], 1)))
                            if hidden else None)  # the original's order: class token last
        x = self.layernorm_post(x)[:, 1:]  # (B, h*w, C)
        return model_output("BaseModelOutputWithPooling", return_dict, last_hidden_state=self.vision_adapter(x),
                            hidden_states=tuple(states) if hidden else None)


def _check_rotary(model) -> None:
    """Refuse a ``freqs_ci`` table that ``rope_axial`` with Llama 4's options does not reproduce."""
    cfg = model.config
    heads = int(cfg.num_attention_heads)
    head_dim = cfg.hidden_size // heads
    if head_dim % 4:
        raise ValueError(f"head_dim={head_dim}: expected a multiple of 4 (2D RoPE splits the pairs between x and y)")
    g = int(cfg.image_size) // int(cfg.patch_size)
    pe = build("rope_axial", head_dim=head_dim, num_heads=heads,
               **_llama4_rope_kwargs(float(cfg.rope_parameters["rope_theta"])))
    cos, sin = rope_tables(pe((g, g)))  # (1, 1, g*g, head_dim/2) each
    cos = torch.cat([cos[0, 0], torch.ones_like(cos[0, 0, :1])])  # the class token last, unrotated
    sin = torch.cat([sin[0, 0], torch.zeros_like(sin[0, 0, :1])])
    ref = model.rotary_embedding.freqs_ci.detach().cpu().reshape(g * g + 1, -1)  # (g*g + 1, head_dim/2) complex
    if ref.shape != cos.shape or not (torch.allclose(ref.real.float(), cos, atol=1e-5) and
                                      torch.allclose(ref.imag.float(), sin, atol=1e-5)):
        raise ValueError("rotary_embedding.freqs_ci is not Llama 4's 1-based (x | y) interleaved table of the config's "
                         "grid: rope_axial(axis_order='xy', layout='interleaved', offset=1) reproduces that one only")


@register_tower("transformers", "Llama4VisionModel")
def convert_llama4(model, pe: str | None = None, *, pe_kwargs: dict | None = None, pe_at: str = "input",
                   peg_blocks=(0,), keep_abs_pos: bool | None = None) -> Llama4Tower:
    """A ``Llama4Tower`` with the weights of a ``Llama4VisionModel`` (module docstring)."""
    if float(model.config.attention_dropout):
        raise ValueError(f"attention_dropout={model.config.attention_dropout}: expected 0 (vispe copies no dropout)")
    _check_rotary(model)
    tower = Llama4Tower(model)
    tower.setup_pe(pe, pe_kwargs, pe_at=pe_at, peg_blocks=peg_blocks, keep_abs_pos=keep_abs_pos)
    return tower
