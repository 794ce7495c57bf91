"""2D image encodings, each composed from the 1D axis primitives of ``vispe.axis``.

Importing this package registers every built-in encoding (one import line per file).
"""
from vispe.image import sine  # noqa: F401
from vispe.image import learned_rowcol  # noqa: F401
from vispe.image import learned_abs  # noqa: F401
from vispe.image import fourier  # noqa: F401
from vispe.image import axis_compose  # noqa: F401
from vispe.image import peg  # noqa: F401
from vispe.image import none  # noqa: F401
from vispe.image import rope_axial  # noqa: F401
from vispe.image import rope_mixed  # noqa: F401
from vispe.image import relbias  # noqa: F401
from vispe.image import relbias_axis  # noqa: F401
from vispe.image import irpe  # noqa: F401
from vispe.image import cpb  # noqa: F401
from vispe.image import relpos_decomposed  # noqa: F401
