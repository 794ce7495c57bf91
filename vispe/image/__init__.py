"""2D image encodings, each composed from the 1D axis primitives of ``vispe.axis``.

Importing this package registers every built-in encoding (one import line per file).
"""
