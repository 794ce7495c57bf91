"""vispe: 2D positional encodings for vision models.

    import vispe
    vispe.available()                 # every registered encoding
    pe = vispe.build("sine", dim=256)  # one by name
"""
from vispe.encoding import AdditiveEncoding, BiasEncoding, ConditionalEncoding, PositionEncoding, RotaryEncoding
from vispe.registry import available, build, family_of, register

__version__ = "0.1.0"

__all__ = ["available", "build", "family_of", "register", "PositionEncoding", "AdditiveEncoding",
           "RotaryEncoding", "BiasEncoding", "ConditionalEncoding", "__version__"]
