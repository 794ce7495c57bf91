"""1D axis primitives: pure functions of positions and thin modules, one concept per file.

Absolute codes: ``sinusoidal`` (raw/normalised index, sinusoids), ``learned`` (tables),
``complex_order`` (Wang et al. 2020), ``ode`` (FLOATER), ``multiplicative`` (x * p).
Rotary: ``rope``, ``rope_scaling`` (PI, NTK-aware, YaRN past the training length). Relative: ``relative`` (offsets, Shaw clipping, T5 buckets), ``shaw``, ``t5``,
``transformer_xl``, ``deberta``, ``alibi``.

The functions ``sinusoidal``, ``multiplicative`` and ``complex_order`` share their module's name;
they are not re-exported here so that ``vispe.axis.sinusoidal`` etc. stay the modules
(``import vispe.axis.sinusoidal as S`` and patching keep working): call them as
``vispe.axis.sinusoidal.sinusoidal(...)`` or ``from vispe.axis.sinusoidal import sinusoidal``.
"""
from vispe.axis import complex_order, multiplicative, sinusoidal
from vispe.axis.alibi import AlibiBias, alibi_bias, alibi_slopes
from vispe.axis.complex_order import ComplexOrder1d
from vispe.axis.deberta import DebertaRelative, deberta_delta
from vispe.axis.learned import LearnedTable1d, interpolate_rows, resize_table_1d
from vispe.axis.multiplicative import Multiplicative
from vispe.axis.ode import ODEEncoding1d, RecurrentEncoding1d, TimeMLP, euler_step, rk4_step
from vispe.axis.relative import clipped_index, relative_offsets, t5_bucket
from vispe.axis.rope import apply_rope, half_to_interleaved, interleaved_to_half, rope_angles, rope_frequencies
from vispe.axis.rope_scaling import ntk_frequencies, pi_positions, scaling_factor, yarn_frequencies, yarn_mscale
from vispe.axis.shaw import ShawRelative, shaw_attention, shaw_index, shaw_key_term, shaw_logits, shaw_value_term
from vispe.axis.sinusoidal import normalized_index, raw_index, single_sinusoid, sinusoid_frequencies
from vispe.axis.t5 import T5RelativeBias
from vispe.axis.transformer_xl import TransformerXLRelative

__all__ = [
    "sinusoidal", "multiplicative", "complex_order",  # modules (see above)
    "raw_index", "normalized_index", "single_sinusoid", "sinusoid_frequencies",
    "LearnedTable1d", "interpolate_rows", "resize_table_1d",
    "ComplexOrder1d", "Multiplicative",
    "ODEEncoding1d", "RecurrentEncoding1d", "TimeMLP", "euler_step", "rk4_step",
    "rope_frequencies", "rope_angles", "apply_rope", "half_to_interleaved", "interleaved_to_half",
    "scaling_factor", "pi_positions", "ntk_frequencies", "yarn_frequencies", "yarn_mscale",
    "relative_offsets", "clipped_index", "t5_bucket",
    "ShawRelative", "shaw_attention", "shaw_index", "shaw_key_term", "shaw_logits", "shaw_value_term",
    "T5RelativeBias", "TransformerXLRelative", "DebertaRelative", "deberta_delta",
    "AlibiBias", "alibi_bias", "alibi_slopes",
]
