"""Query sources: DETR's learned queries, Conditional / DAB anchors, Deformable DETR's (two-stage proposals), DINO's (denoising groups in dn/)."""
