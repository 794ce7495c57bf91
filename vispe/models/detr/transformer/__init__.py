"""The encoder-decoder: dense and deformable layers, the one decode loop, Relation-DETR's relation, BoxRPB."""
