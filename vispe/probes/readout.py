"""A PosENet-like read-out probe (Islam, Jia & Bruce, ICLR 2020) and its training loop.

The backbone is frozen; its multi-scale maps are resized to the target size and concatenated,
and a single trainable convolution reads the position map out of them::

    f = concat_i( resize(m_i, (h, w)) / s_i )        # (B, sum C_i, h, w), s_i: RMS of level i
    p = conv_kxk(f)                                  # (B, T, h-k+1, w-k+1), one channel per target

trained on a pixel-wise mean squared error against the target maps plus a small ridge term,
``mean (p - t)^2 + weight_decay * ||W||^2``, full batch, by L-BFGS (strong-Wolfe line search; no
learning rate to tune, about ``1.2 * steps`` passes). The read-out is linear, so this is a ridge
regression solved iteratively. One probe with T output channels stands for T probes: the objective
is a sum of T independent problems, so its minimiser is the T separate minimisers (a joint L-BFGS
run differs from separate runs only in where ``steps`` stops it).

Details that keep the probe itself from adding position:

* the read-out conv (``kernel_size`` 3 as PosENet, or 1) is ``valid`` by default: no padding, so
  the prediction is (h-k+1, w-k+1) and is scored against the centre crop of the target. A padded
  read-out could read the border itself: ``zeros`` (PosENet's own) marks it, and ``circular`` puts
  a seam there on non-periodic maps. Those modes stay available for comparison;
  ``kernel_size=1`` needs no padding and takes only ``valid``;
* resizing is bilinear (``align_corners=False``, antialiased when shrinking); a constant map stays
  constant up to float rounding (about 1e-7, see ``metrics.flat``);
* level scales ``s_i`` are single numbers measured on the training features, the same at every
  position; weights start at zero and the bias at the target's mean, so training is deterministic.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vispe import _checks
from vispe.probes import metrics

READOUT_PADDINGS = ("valid", "circular", "zeros", "reflect", "replicate")


@dataclass
class ProbeSettings:
    """How the read-out is trained (written to every CSV row)."""

    kernel_size: int = 3
    readout_padding: str = "valid"
    steps: int = 40  # L-BFGS iterations
    weight_decay: float = 1e-3  # ridge coefficient on the conv weights (features have unit RMS per level)

    def __post_init__(self) -> None:
        _checks.choice("kernel_size", self.kernel_size, (1, 3))
        _checks.choice("readout_padding", self.readout_padding, READOUT_PADDINGS)
        if self.kernel_size == 1 and self.readout_padding != "valid":
            raise ValueError(f"readout_padding={self.readout_padding!r} with kernel_size=1: a 1x1 read-out "
                             "is not padded; expected 'valid'")
        _checks.positive_int("steps", self.steps)
        wd = self.weight_decay
        if isinstance(wd, bool) or not isinstance(wd, (int, float)) or wd < 0:
            raise ValueError(f"weight_decay={self.weight_decay!r}: expected a non-negative number")

    def as_row(self) -> dict:
        return {f"probe_{k}": v for k, v in asdict(self).items()}


def stack_features(maps: list[torch.Tensor], size, scales: list[float] | None = None):
    """Resize every map to ``size``, divide level i by ``scales[i]`` (its RMS when None), concatenate.

    Returns ``(features (B, sum C_i, h, w), scales)``; pass the training scales to the test call.
    """
    h, w = _checks.grid_shape("size", size)
    if not maps:
        raise ValueError("maps=[]: expected at least one feature map (B, C, h, w)")
    if scales is not None and len(scales) != len(maps):
        raise ValueError(f"scales has {len(scales)} entries: expected one per map ({len(maps)})")
    out, used = [], []
    for i, m in enumerate(maps):
        if m.dim() != 4:
            raise ValueError(f"maps[{i}] has shape {tuple(m.shape)}: expected (B, C, h, w)")
        m = m.float()
        if tuple(m.shape[-2:]) != (h, w):
            m = F.interpolate(m, size=(h, w), mode="bilinear", align_corners=False, antialias=True)  # (B, C, h, w)
        s = float(m.square().mean().sqrt()) if scales is None else float(scales[i])
        s = s if s > 0 else 1.0
        out.append(m / s)
        used.append(s)
    return torch.cat(out, dim=1), used  # (B, sum C_i, h, w)


class ReadoutProbe(nn.Module):
    """One ``kernel_size`` conv from ``in_channels`` features to ``out_channels`` position maps."""

    def __init__(self, in_channels: int, out_channels: int = 1, kernel_size: int = 3,
                 padding_mode: str = "valid") -> None:
        super().__init__()
        _checks.positive_int("in_channels", in_channels)
        _checks.positive_int("out_channels", out_channels)
        _checks.choice("kernel_size", kernel_size, (1, 3))
        _checks.choice("padding_mode", padding_mode, READOUT_PADDINGS)
        valid = padding_mode == "valid"
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=0 if valid else kernel_size // 2,
                              padding_mode="zeros" if valid else padding_mode)
        nn.init.zeros_(self.conv.weight)
        nn.init.zeros_(self.conv.bias)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.conv(feats)  # (B, T, h', w'): h' = h - k + 1 when valid


def centre_crop(maps: torch.Tensor, shape) -> torch.Tensor:
    """The centre (h', w') of maps (..., h, w): what a valid read-out's prediction covers."""
    hh, ww = _checks.grid_shape("shape", shape)
    h, w = maps.shape[-2:]
    if hh > h or ww > w:
        raise ValueError(f"shape={(hh, ww)}: expected at most the maps' size {(h, w)}")
    top, left = (h - hh) // 2, (w - ww) // 2
    return maps[..., top:top + hh, left:left + ww]


def fit_probe(feats: torch.Tensor, targets: torch.Tensor, settings: ProbeSettings | None = None):
    """Train a probe on frozen ``feats`` (N, C, h, w) to predict ``targets`` (T, h, w) for every image.

    Returns ``(probe, losses)``; ``losses`` is the training objective at every evaluation.
    """
    settings = settings or ProbeSettings()
    if feats.dim() != 4 or targets.dim() != 3 or feats.shape[-2:] != targets.shape[-2:]:
        raise ValueError(f"feats {tuple(feats.shape)} and targets {tuple(targets.shape)}: expected "
                         "(N, C, h, w) and (T, h, w) of the same (h, w)")
    probe = ReadoutProbe(feats.shape[1], targets.shape[0], settings.kernel_size, settings.readout_padding)
    with torch.no_grad():
        probe.conv.bias.copy_(targets.mean((1, 2)))
    opt = torch.optim.LBFGS(probe.parameters(), lr=1.0, max_iter=settings.steps, history_size=20,
                            line_search_fn="strong_wolfe")
    with torch.no_grad():
        out_shape = probe(feats[:1]).shape[-2:]
    goal = centre_crop(targets, out_shape)[None].expand(feats.shape[0], -1, -1, -1).float()  # (N, T, h', w')
    feats = feats.detach().float()
    losses: list[float] = []

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(probe(feats), goal) + settings.weight_decay * probe.conv.weight.square().sum()
        loss.backward()
        losses.append(loss.item())
        return loss

    opt.step(closure)
    return probe.eval().requires_grad_(False), losses


@torch.no_grad()
def evaluate_probe(probe: ReadoutProbe, feats: torch.Tensor, targets: torch.Tensor) -> dict:
    """SPC and MAE of each target, averaged over the images of ``feats`` (N, C, h, w).

    Returns ``{"pred": (N, T, h', w'), "targets": (T, h', w'), "spc": (T,), "mae": (T,), "flat": (T,)}``:
    targets cropped to the prediction (valid read-out), ``flat`` the fraction of images whose
    prediction was flat (SPC undefined, counted as 0).
    """
    pred = probe(feats)  # (N, T, h', w')
    targets = centre_crop(targets, pred.shape[-2:])  # (T, h', w')
    spc = torch.stack([metrics.spc(pred[:, t], targets[t]) for t in range(targets.shape[0])])  # (T, N)
    mae = torch.stack([metrics.mae(pred[:, t], targets[t]) for t in range(targets.shape[0])])  # (T, N)
    flat = torch.stack([metrics.flat(pred[:, t]) for t in range(targets.shape[0])])  # (T, N)
    return {"pred": pred, "targets": targets, "spc": spc.mean(1), "mae": mae.mean(1), "flat": flat.double().mean(1)}
