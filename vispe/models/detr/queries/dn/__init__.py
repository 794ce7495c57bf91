"""DINO's parts (Zhang et al., ICLR 2023), each a small module tested against IDEA-Research/DINO:

* ``groups``: contrastive denoising queries (``prepare_cdn``), ``mask``: their attention mask;
* ``split``: the decoder's outputs split into denoising and matching ones (``dn_post_process``);
* ``selection``: mixed query selection (reference boxes from the top-k encoder proposals, content learned);
* ``lookahead``: the decoder loop with look-forward-twice;
* ``query_pos``: the positional queries, ``MLP(sine(box))``;
* ``queries``: all of it as one module a detector calls (``DinoDecoding``);
* ``loss``: the denoising losses (focal + L1 + GIoU on the groups' positives, no matching, per layer).
"""
from vispe.models.detr.queries.dn.groups import DenoisingGroups, noise_boxes, noise_labels, num_groups, prepare_cdn
from vispe.models.detr.queries.dn.lookahead import layer_boxes, look_forward_twice
from vispe.models.detr.queries.dn.loss import denoising_losses, weighted_total
from vispe.models.detr.queries.dn.mask import dn_attention_mask
from vispe.models.detr.queries.dn.queries import DinoDecoding
from vispe.models.detr.queries.dn.query_pos import DinoQueryPos
from vispe.models.detr.queries.dn.selection import MixedQuerySelection
from vispe.models.detr.queries.dn.split import dn_post_process

__all__ = ["DenoisingGroups", "DinoDecoding", "DinoQueryPos", "MixedQuerySelection", "denoising_losses", "dn_attention_mask",
           "dn_post_process", "layer_boxes", "look_forward_twice", "noise_boxes", "noise_labels", "num_groups",
           "prepare_cdn", "weighted_total"]
