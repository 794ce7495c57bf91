"""Heads and losses: the output dict, the Hungarian matcher, the set criterion, post-processing."""
