"""vispe's ``load_detr`` against the papers' own code: Atten4Vis/ConditionalDETR and IDEA-Research/DAB-DETR.

Builds each paper's model from its repository (a checkout you pass; nothing is copied into vispe),
draws every weight and BN statistic at random, writes its ``checkpoint.pth`` as the paper's main.py
does (``{"model": state_dict, "args": args}``), loads that file with ``vispe.models.detr.load_detr``
and compares final and auxiliary outputs on a padded, non-square batch.

    git clone https://github.com/Atten4Vis/ConditionalDETR; git clone https://github.com/IDEA-Research/DAB-DETR
    python results/compare/parity_official_detr.py --conditional ConditionalDETR --dab DAB-DETR

Three adjustments let the papers' code run offline on today's torch, and none touches the
computation: torchvision's ResNet is built without downloading ImageNet weights (they are redrawn
anyway); ConditionalDETR's version test, which misreads torch 2 as older than 1.9, gets the name it
imports (``_torch2_names``); DAB-DETR's ``models`` package is entered without its ``__init__`` (which
imports the compiled deformable-attention op that DAB-DETR itself does not use).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import types
from pathlib import Path

import torch
import torchvision

from vispe.models.detr import load_detr

# hidden_dim 256: ConditionalDETR's query sine is hard-wired to 128 channels per axis
ARGS = dict(lr_backbone=1e-5, masks=False, backbone="resnet18", dilation=False, position_embedding="sine",
            hidden_dim=256, dropout=0.0, nheads=8, num_queries=10, dim_feedforward=128, enc_layers=2, dec_layers=3,
            pre_norm=False, aux_loss=True, dataset_file="coco", device="cpu", frozen_weights=None,
            set_cost_class=2.0, set_cost_bbox=5.0, set_cost_giou=2.0, cls_loss_coef=2.0, bbox_loss_coef=5.0,
            giou_loss_coef=2.0, mask_loss_coef=1.0, dice_loss_coef=1.0, focal_alpha=0.25)
DAB_ARGS = dict(pe_temperatureH=20, pe_temperatureW=20, batch_norm_type="FrozenBatchNorm2d",
                transformer_activation="prelu", num_patterns=0, random_refpoints_xy=False, num_select=300,
                modelname="dab_detr")


def _torch2_names():
    """ConditionalDETR's attention.py tests the torch version as ``(major == 1 and minor) < 9``, which is
    true on torch 2, and then imports ``_LinearWithBias`` and ``torch._overrides`` (renamed since): give
    it what its own else-branches take."""
    import torch.nn.modules.linear as linear
    import torch.overrides

    if not hasattr(linear, "_LinearWithBias"):
        linear._LinearWithBias = linear.NonDynamicallyQuantizableLinear
    sys.modules.setdefault("torch._overrides", torch.overrides)


def _offline_resnets():
    for name in ("resnet18", "resnet34", "resnet50", "resnet101"):
        make = getattr(torchvision.models, name)
        if getattr(make, "_offline", False):
            continue

        def offline(*a, _make=make, pretrained=False, **kw):
            kw.setdefault("weights", None)
            return _make(*a, **kw)
        offline._offline = True
        setattr(torchvision.models, name, offline)


def _enter(repo: Path, package_dir: str | None):
    for mod in [m for m in sys.modules if m.split(".")[0] in ("models", "util", "datasets")]:
        del sys.modules[mod]
    sys.path.insert(0, str(repo))
    if package_dir is not None:  # the package without its __init__
        pkg = types.ModuleType("models")
        pkg.__path__ = [str(repo / package_dir)]
        sys.modules["models"] = pkg


def build(design: str, repo: Path):
    _offline_resnets()
    _torch2_names()
    if design == "conditional":
        _enter(repo, None)
        from models.conditional_detr import build as build_model
        args = argparse.Namespace(**ARGS)
    else:
        _enter(repo, "models")
        from models.DAB_DETR.DABDETR import build_DABDETR as build_model
        args = argparse.Namespace(**ARGS, **DAB_ARGS)
    from util.misc import NestedTensor  # the paper's own input type

    model = build_model(args)[0]
    sys.path.remove(str(repo))
    return model, args, NestedTensor


def randomise(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.is_floating_point():
                continue
            if "running_var" in name:
                t.copy_(torch.rand(t.shape, generator=g) * 1.5 + 0.5)
            elif t.dim() > 1:
                t.copy_(torch.randn(t.shape, generator=g) / t[0].numel() ** 0.5)
            elif name.endswith("weight"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
    return model.eval()


def padded_batch():
    g = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, 96, 128, generator=g)
    mask = torch.zeros(2, 96, 128, dtype=torch.bool)
    mask[1, 64:, :] = True
    mask[1, :, 80:] = True
    images[mask.unsqueeze(1).expand_as(images)] = 0
    return images, mask


def compare(design: str, repo: Path) -> dict:
    ref, args, NestedTensor = build(design, repo)
    ref = randomise(ref)
    images, mask = padded_batch()
    with torch.no_grad():
        out_ref = ref(NestedTensor(images, mask))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "checkpoint.pth"
        torch.save({"model": ref.state_dict(), "args": args, "epoch": 0}, path)
        model = load_detr(path).eval()
    with torch.no_grad():
        out = model(images, mask)
    diff = dict(logits=(out["pred_logits"] - out_ref["pred_logits"]).abs().max().item(),
                boxes=(out["pred_boxes"] - out_ref["pred_boxes"]).abs().max().item())
    diff["aux"] = max(max((a["pred_logits"] - b["pred_logits"]).abs().max().item(),
                          (a["pred_boxes"] - b["pred_boxes"]).abs().max().item())
                      for a, b in zip(out["aux_outputs"], out_ref["aux_outputs"], strict=True))
    diff["scale"] = out_ref["pred_logits"].abs().max().item()
    return diff


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conditional", type=Path, help="checkout of Atten4Vis/ConditionalDETR")
    p.add_argument("--dab", type=Path, help="checkout of IDEA-Research/DAB-DETR")
    a = p.parse_args(argv)
    if a.conditional is None and a.dab is None:
        p.error("give --conditional and/or --dab")
    torch.manual_seed(0)
    for design, repo in (("conditional", a.conditional), ("dab", a.dab)):
        if repo is not None:
            d = compare(design, repo.resolve())
            print(f"{design:12s} max |vispe - paper|: logits {d['logits']:.2e}, boxes {d['boxes']:.2e}, "
                  f"auxiliary {d['aux']:.2e} (logits up to {d['scale']:.1f})")


if __name__ == "__main__":
    main()
