"""Figures of encodings and trained models; each figure is one function returning a matplotlib Figure.

* ``codes``: the matrices behind them (position codes, bias matrices, similarity, offset maps).
* ``similarity``: cosine-similarity mosaic (ViT paper, Fig. 7) and the resolution-change view.
* ``decay``: the position term against the 2D offset.
* ``tables``: relative-bias tables per head, learned row / column tables.
* ``attention_distance``: mean attention distance per block and head of a ViT.
* ``trained``: a run's trained model, or a small float16 weights file, for these figures.
"""
