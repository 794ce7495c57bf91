"""NaFlex inputs (SigLIP-2's native flexible resolution; timm ``naflex_transforms`` /
``NaFlexCollator``): each image resized keeping its aspect ratio to at most ``max_seq_len``
patches, cut into patches with their (y, x) indices, and a batch packed to one length with a
validity mask. Built from timm's own transforms and collator (no copy), so the packed batch is
exactly what timm's ``NaFlexVit`` takes; ``vispe.models.naflex.forward_packed`` runs it through any
vispe ViT.

    transform = naflex_transform(patch_size=16, max_seq_len=256)   # PIL image or (C, H, W) tensor
    sample = transform(image)              # {"patches": (n, ph*pw*C), "patch_coord": (n, 2), "patch_valid": (n,)}
    batch = pack([transform(a), transform(b)], max_seq_len=256)    # (B, 256, ...) + "seq_len"

``patches`` hold each patch flattened as (ph, pw, C) (timm's ``channels_last``), ``patch_coord``
(y, x) patch indices, ``patch_valid`` False on the padding that fills a row up to ``max_seq_len``.
"""
from __future__ import annotations

from vispe import _checks


def naflex_transform(patch_size=16, max_seq_len: int = 256, *, interpolation: str = "bilinear",
                     longest: float = 0.0):
    """timm's ``ResizeKeepRatioToSequence`` then ``Patchify``: image -> one NaFlex sample (a dict).

    ``longest`` as timm's (0: the shorter side sets the scale, 1: the longer; the patch budget
    always holds). Input: a PIL image or a (C, H, W) float tensor (normalise it before, as the model expects).
    """
    from timm.data.naflex_transforms import Patchify, ResizeKeepRatioToSequence
    from torchvision import transforms

    ph, pw = _checks.grid_shape("patch_size", patch_size)
    _checks.positive_int("max_seq_len", max_seq_len)
    if not 0.0 <= longest <= 1.0:
        raise ValueError(f"longest={longest!r}: expected a number in [0, 1]")
    return transforms.Compose([
        ResizeKeepRatioToSequence(patch_size=(ph, pw), max_sequence_len=max_seq_len, interpolation=interpolation,
                                  longest=longest),
        Patchify(patch_size=(ph, pw)),
    ])


def pack(samples: list[dict], max_seq_len: int | None = None) -> dict:
    """Samples of ``naflex_transform`` packed by timm's ``NaFlexCollator``: ``patches`` (B, L, ph*pw*C),
    ``patch_coord`` (B, L, 2), ``patch_valid`` (B, L), ``seq_len`` L (``max_seq_len``, or the
    longest sample when None). A sample longer than L is refused (the collator would cut it)."""
    from timm.data.naflex_dataset import NaFlexCollator

    if not samples:
        raise ValueError("samples=[]: expected at least one NaFlex sample")
    longest = max(int(s["patches"].shape[0]) for s in samples)
    L = longest if max_seq_len is None else _checks.positive_int("max_seq_len", max_seq_len)
    if longest > L:
        raise ValueError(f"max_seq_len={L}: a sample has {longest} patches (expected at most max_seq_len)")
    batch, _ = NaFlexCollator(max_seq_len=L)([(s, 0) for s in samples])
    return batch
