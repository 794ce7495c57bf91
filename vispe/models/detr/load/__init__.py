"""Loaders: checkpoints of DETR, Conditional / DAB-DETR and Deformable DETR into vispe's detector, the key-renaming engine, upgrades of vispe's own checkpoints."""
