"""RoPE resolution scaling along one axis: position interpolation, NTK-aware base, YaRN by parts.

A rotary code trained on ``L`` positions along an axis (the training grid's length, ``ref``) and
run on ``n`` positions sees angles it never saw once ``n > L``. The scaling factor of the axis is

    s = max(n / L, 1)

(FiT's ``clamp_min(max_pe_len / ori_max_pe_len, 1)``): every method below is the identity when the
axis is not longer than in training (s = 1: positions inside the trained range need no change,
and the papers define their methods for extension only). At s = 1 each gives the unscaled
frequencies and positions bit for bit (``1 + 0``, ``x / 1``, ``x * 1**k`` are exact).

* **PI**, position interpolation (Chen et al., 2023, "Extending Context Window of Large Language
  Models via Positional Interpolation"): positions ``m -> m / s``, so n positions span the
  trained range; every frequency is in effect divided by s. ``pi_positions``.
* **NTK-aware** base scaling (bloc97, 2023, "NTK-Aware Scaled RoPE", reddit r/LocalLLaMA; the
  formula of Peng et al., 2023, YaRN, section 3.1): for ``f_j = base^(-2j/d)``, j < d/2,
  ``base' = base * s^(d / (d - 2))``, so the highest frequency (j = 0) is kept and the lowest
  (j = d/2 - 1) is divided by exactly s, geometric in between:
  ``f'_j = f_j * s^(-2j / (d - 2)) = f_j * s^(-j / (K - 1))`` with K = d/2 frequencies. The last form
  needs no base, so it also applies to any geometric schedule of K >= 2 frequencies (DINOv3's
  periods: ``max_period -> max_period * s``, ``min_period`` kept). ``ntk_frequencies``.
* **YaRN "NTK-by-parts"** (Peng et al., 2023, "YaRN: Efficient Context Window Extension of Large
  Language Models", eq. 17-18): with ``r = L / lambda = L * f / (2 pi)`` the number of turns a
  pair makes over the trained length and the ramp ``gamma(r) = 0`` for r < alpha, 1 for r > beta,
  ``(r - alpha) / (beta - alpha)`` between,

      f' = (1 - gamma(r)) * f / s + gamma(r) * f

  computed as ``f * (1 + (1 - gamma) * (1/s - 1))`` (exact at s = 1): pairs that turn many times
  (high frequencies) are kept, pairs that make less than alpha turns are interpolated as PI.
  alpha = 1, beta = 32 are the paper's values for LLaMA (FiT: ``beta_slow=1, beta_fast=32``).
  The ramp is linear in r as the paper writes it; the paper's code (jquesnelle/yarn, copied by
  FiT) ramps linearly in the pair index between ``floor`` / ``ceil`` of the indices where r = beta
  and r = alpha: the two agree on every pair that is fully kept or fully interpolated, and differ on
  the few pairs of the ramp. ``yarn_frequencies``; it needs no base (any frequency set, learned too).
  YaRN's attention temperature, ``sqrt(1/t) = 0.1 ln s + 1`` on q and k, is **not** part of the
  angles: ``yarn_mscale`` computes it for a caller who wants to scale q and k.

``s`` is a tensor broadcastable against the frequencies (one factor per image and axis when the
valid sizes differ). All arithmetic in float32.
"""
from __future__ import annotations

import math

import torch

from vispe import _checks

SCALINGS = ("none", "pi", "ntk", "yarn")
#: YaRN's ramp ends for LLaMA (Peng et al., 2023, section 3.2), FiT's beta_slow / beta_fast
YARN_ALPHA, YARN_BETA = 1.0, 32.0


def scaling_factor(n: torch.Tensor, ref) -> torch.Tensor:
    """``s = max(n / ref, 1)`` of each axis: ``n`` run length(s), ``ref`` training length(s).  # n's shape"""
    ref = torch.as_tensor(ref, dtype=torch.float32, device=n.device)
    return (n.float() / ref).clamp(min=1.0)


def pi_positions(pos: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Position interpolation, ``pos / s`` (Chen et al., 2023).  # pos's shape"""
    return pos / s


def ntk_frequencies(freqs: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """NTK-aware scaling of a geometric schedule ``freqs`` (K,), highest first: ``f_j * s^(-j/(K-1))``,
    equal to ``base' = base * s^(d/(d-2))`` for ``f_j = base^(-2j/d)``, d = 2K.  # s.shape[:-1] + (K,)

    ``s`` (..., 1): one factor per row. K = 1 has no schedule to bend (d/(d-2) divides by zero)."""
    K = freqs.shape[-1]
    if K < 2:
        raise ValueError(f"freqs has {K} frequency: NTK-aware scaling needs at least 2 per axis "
                         "(base * s^(d/(d-2)) with d = 2 is undefined)")
    j = torch.arange(K, dtype=torch.float32, device=freqs.device)  # (K,)
    return freqs * s ** (-j / (K - 1))


def yarn_ramp(r: torch.Tensor, alpha: float = YARN_ALPHA, beta: float = YARN_BETA) -> torch.Tensor:
    """YaRN's ``gamma(r)``: 0 below alpha, 1 above beta, linear between.  # r's shape"""
    return ((r - alpha) / (beta - alpha)).clamp(0.0, 1.0)


def yarn_frequencies(freqs: torch.Tensor, s: torch.Tensor, length, *, alpha: float = YARN_ALPHA,
                     beta: float = YARN_BETA) -> torch.Tensor:
    """YaRN by parts: ``(1 - gamma(r)) f / s + gamma(r) f`` with ``r = length |f| / (2 pi)``.  # broadcast shape

    ``length``: the trained length in the units the frequencies multiply (a number or a tensor
    broadcastable against ``freqs``); ``s`` broadcastable against ``freqs``. Signed frequencies
    (learned ones) keep their sign."""
    r = torch.as_tensor(length, dtype=torch.float32, device=freqs.device) * freqs.abs() / (2 * math.pi)
    keep = yarn_ramp(r, alpha, beta)
    return freqs * (1 + (1 - keep) * (1 / s - 1))


def yarn_mscale(s: torch.Tensor) -> torch.Tensor:
    """YaRN's attention temperature factor on q and k, ``0.1 ln s + 1`` (1 at s <= 1).  # s's shape"""
    return 0.1 * torch.log(s.clamp(min=1.0)) + 1.0


def check_ramp(alpha, beta) -> tuple[float, float]:
    """Checked YaRN ramp ends, ``0 < alpha < beta``."""
    a, b = _checks.positive_float("yarn_alpha", alpha), _checks.positive_float("yarn_beta", beta)
    if not a < b < math.inf:
        raise ValueError(f"yarn_alpha={alpha!r}, yarn_beta={beta!r}: expected yarn_alpha < yarn_beta "
                         "(turns over the training length below which pairs are interpolated, above which kept)")
    return a, b
