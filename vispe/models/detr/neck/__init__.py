"""The neck: backbone levels -> the multi-scale token set, and the position of each level's tokens."""
