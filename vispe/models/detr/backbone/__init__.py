"""Backbones: images (B, 3, H, W) + padding mask -> features + mask (ResNet, the small CNN, a vispe ViT, ViTDet's pyramid)."""
