"""2D image encodings, each composed from the 1D axis primitives of ``vispe.axis``.

Importing this package registers every built-in encoding (one import line per file).
"""
from vispe.image import (
    axis_compose,  # noqa: F401
    comrope,  # noqa: F401
    cpb,  # noqa: F401
    fourier,  # noqa: F401
    irpe,  # noqa: F401
    learned_abs,  # noqa: F401
    learned_rowcol,  # noqa: F401
    liere,  # noqa: F401
    lookhere,  # noqa: F401
    none,  # noqa: F401
    peg,  # noqa: F401
    relbias,  # noqa: F401
    relbias_axis,  # noqa: F401
    relpos_decomposed,  # noqa: F401
    rope_axial,  # noqa: F401
    rope_mixed,  # noqa: F401
    sine,  # noqa: F401
    string,  # noqa: F401
)
