"""vispe: 2D positional encodings for vision models.

    import vispe
    vispe.available()                 # every registered encoding
    pe = vispe.build("sine", dim=256)  # one by name
    report = vispe.audit(model)        # how any vision model encodes position (imported on first use)
"""
from typing import Any

from vispe.encoding import AdditiveEncoding, BiasEncoding, ConditionalEncoding, PositionEncoding, RotaryEncoding
from vispe.registry import available, build, family_of, register

__version__ = "0.1.0"



def __getattr__(name: str) -> Any:
    if name == "audit":  # vispe.audit(model) / vispe.audit.compare(a, b), imported on first use
        import importlib

        return importlib.import_module("vispe.audit")
    raise AttributeError(f"module 'vispe' has no attribute {name!r}")


__all__ = ["available", "build", "family_of", "register", "PositionEncoding", "AdditiveEncoding",
           "RotaryEncoding", "BiasEncoding", "ConditionalEncoding", "__version__"]
