"""The prefix-token rule of each family inside a ViT, with a class token and two register tokens
(issue 19, item 12; README "Encodings" table), for every registered encoding:

* additive: learned position vectors only from an encoding that declares them (``learned_abs``,
  timm's layout), none with ``no_embed_class``; every other additive encoding gives prefix tokens
  no position (they enter the blocks as timm's cls/reg tokens), unless ``pe_kwargs`` asks for
  ``num_prefix_tokens``;
* rotary: prefix tokens unrotated (angle 0; block rotations: the rotation at coordinate 0, the
  identity except for STRING, whose returned R(p) = RoPE(p) P has R(0) = P);
* bias: learned per-head scalars for the prefix rows and columns (BEiT's rule);
* conditional: prefix tokens pass through the PEG unchanged;
* none: no position at all.
"""
import pytest
import torch

import vispe
from vispe.kernels import rope
from vispe.models.vit import create_vit

P = 3  # class + 2 registers


def _vit(pe, **kw):
    torch.manual_seed(0)
    m = create_vit("vit_pico", pe=pe, embed_dim=32, depth=1, num_heads=2, img_size=(8, 12), patch_size=4,
                   num_classes=3, class_token=True, reg_tokens=2, **kw).eval()
    with torch.no_grad():
        for p in m.parameters():  # zero-initialised prefix scalars would hide a wrong rule
            p.add_(torch.randn_like(p) * 0.1)
    return m


@pytest.mark.parametrize("no_embed_class", [False, True])
@pytest.mark.parametrize("pe", vispe.available())
def test_prefix_rule_of_each_family(pe, no_embed_class):
    m = _vit(pe, no_embed_class=no_embed_class)
    assert m.num_prefix_tokens == P
    x = torch.randn(2, 3, 8, 12)
    with torch.no_grad():
        tokens, ctx = m._tokens(x, None)  # (B, P+N, C), before the blocks
        raw = torch.cat([m.cls_token, m.reg_token], 1).expand(2, -1, -1)  # (B, P, C) timm's prefix tokens
        fam = m.pe_family
        if fam == "additive" and pe == "learned_abs" and not no_embed_class:
            assert m.pe.prefix_embed.shape == (1, P, 32)
            torch.testing.assert_close(tokens[:, :P], raw + m.pe.prefix_embed)
        else:
            torch.testing.assert_close(tokens[:, :P], raw, rtol=0, atol=0)  # no position
            assert not any("prefix_embed" in n for n, _ in m.named_parameters())
        if fam == "additive":
            if not (pe == "learned_abs" and not no_embed_class):
                assert m.pe.prefix() is None
        elif fam == "rotary":
            attn = m.blocks[0].attn
            q, k = torch.randn(2, 2, 2, P + 6, 16).unbind(0)
            rq, rk = rope.rotate_qk(attn.pe, torch.stack([q, k]), ctx.shape, ctx.mask, ctx.num_prefix_tokens,
                                    impl=attn.rope_impl).unbind(0)  # (B, heads, P+N, hd) each
            zero = attn.pe.zero_rotation() if hasattr(attn.pe, "zero_rotation") else None
            if zero is not None:  # STRING: R(0) = P, the paper's identity in its frame (vispe.image.string)
                from vispe.kernels.rope_blocks import apply_blocks

                q, k = (apply_blocks(t, torch.cat([zero[None, :, None].expand(2, 2, P, -1, -1, -1),
                                                   torch.eye(16).expand(2, 2, 6, 1, 16, 16)], 2), attn.pe.layout)
                        for t in (q, k))  # what R(0) gives: P on the prefix, the grid as it was
            tol = dict(rtol=1e-6, atol=1e-6) if zero is not None else dict(rtol=0, atol=0)  # P: one product
            torch.testing.assert_close(rq[:, :, :P], q[:, :, :P], **tol)  # unrotated
            torch.testing.assert_close(rk[:, :, :P], k[:, :, :P], **tol)
            assert (rq[:, :, P:] - q[:, :, P:]).abs().max() > 1e-3  # the grid tokens are rotated
        elif fam == "bias":
            enc = m.blocks[0].attn.pe
            q = torch.randn(2, 2, P + 6, 16)
            bias = enc(ctx.shape, None, dtype=torch.float32, **({"q": q} if enc.contextual else {}))
            assert bias.shape[-2:] == (P + 6, P + 6)
            b = bias[0]
            torch.testing.assert_close(b[:, :P, :P], enc.prefix_to_prefix)
            torch.testing.assert_close(b[:, :P, P:], enc.prefix_to_token[:, :, None].expand(-1, -1, 6))
            torch.testing.assert_close(b[:, P:, :P], enc.token_to_prefix[:, None, :].expand(-1, 6, -1))
        elif fam == "conditional":
            out = m._apply_peg(tokens, ctx)
            torch.testing.assert_close(out[:, :P], tokens[:, :P], rtol=0, atol=0)
            assert (out[:, P:] - tokens[:, P:]).abs().max() > 1e-4
        else:
            assert fam == "none" and m.pe is None and all(b.attn.pe is None for b in m.blocks)


def test_an_additive_encoding_can_ask_for_learned_prefix_vectors():
    m = _vit("sine", pe_kwargs={"num_prefix_tokens": P})
    with torch.no_grad():
        tokens, _ = m._tokens(torch.randn(1, 3, 8, 12), None)
    raw = torch.cat([m.cls_token, m.reg_token], 1)
    torch.testing.assert_close(tokens[:, :P], raw + m.pe.prefix_embed)
    with pytest.raises(ValueError, match="2 prefix vectors: expected 3"):
        _vit("sine", pe_kwargs={"num_prefix_tokens": 2})(torch.randn(1, 3, 8, 12))

