"""Writes the detector checkpoints of ``tests/test_detr_compat.py``: tiny models built and saved by the
code of commit 77c7ae1 (before issue 46's refactor), so that the test proves files written then still load
and give the same outputs.

    PYTHONPATH=. python tests/data/detr_compat/make_fixtures.py      # from the repository root, at that commit

Each ``<name>.pt`` holds ``{"config": model.config, "model": state_dict, "outputs"}``
(a run folder's ``checkpoint.pt`` keeps the same ``config``-and-``model`` pair, with the train config
instead of ``model.config``; ``train_checkpoint.pt`` is one, as ``vispe.train.checkpoint.save`` writes it
after one SGD step). The outputs are the eval-mode ``pred_logits`` / ``pred_boxes`` (and the auxiliary
outputs') on the padded batch of two images ``inputs()`` draws.
"""
from pathlib import Path

import torch

from vispe.models.detr import create_detr

HERE = Path(__file__).parent
DENSE = dict(backbone="small_cnn", backbone_widths=(4, 8, 8, 16), d_model=16, nheads=2, enc_layers=1, dec_layers=2,
             dim_feedforward=16, num_queries=3, dropout=0.0)
DEFORMABLE = dict(backbone="small_cnn", backbone_widths=(4, 8, 8), d_model=32, nheads=2, enc_layers=1, dec_layers=2,
                  dim_feedforward=16, num_queries=3, dropout=0.0, attention="deformable", num_feature_levels=2,
                  backbone_levels=1, n_points=2, pe_kwargs=dict(offset=-0.5))
MODELS = {
    "dense_dab_boxrpb": dict(DENSE, decoder="dab", box_bias="boxrpb", box_bias_kwargs=dict(hidden=8)),
    "deformable_two_stage": dict(DEFORMABLE, decoder="deformable", decoder_kwargs=dict(with_box_refine=True,
                                                                                      two_stage=True)),
    "deformable_dab": dict(DEFORMABLE, decoder="dab"),
}


def inputs():
    g = torch.Generator().manual_seed(1)
    images = torch.randn(2, 3, 32, 48, generator=g)
    mask = torch.zeros(2, 32, 48, dtype=torch.bool)
    mask[1, :, 32:] = True
    return images, mask


def outputs(model, images, mask) -> dict:
    with torch.no_grad():
        out = model.eval()(images, mask)
    keep = {"pred_logits": out["pred_logits"], "pred_boxes": out["pred_boxes"]}
    for i, a in enumerate(out.get("aux_outputs", [])):
        keep[f"aux{i}_logits"], keep[f"aux{i}_boxes"] = a["pred_logits"], a["pred_boxes"]
    return keep


def main() -> None:
    images, mask = inputs()
    for name, kw in MODELS.items():
        torch.manual_seed(0)
        model = create_detr(3, **kw)
        with torch.no_grad():  # move every parameter off its initial value (zeroed heads included)
            for p in model.parameters():
                p.add_(0.02 * torch.randn_like(p))
        torch.save({"config": model.config, "model": model.state_dict(), "outputs": outputs(model, images, mask)}, HERE / f"{name}.pt")
    # a run folder's checkpoint.pt, as train.py writes it (the train config's detr section, one SGD step)
    from vispe.train import checkpoint as ckpt

    torch.manual_seed(0)
    model = create_detr(3, **DENSE)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    out = model.train()(images, mask)
    (out["pred_logits"].sum() + out["pred_boxes"].sum()).backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    detr = {k: (list(v) if isinstance(v, tuple) else v) for k, v in model.config.items() if k != "num_classes"}
    config = {"model": {"name": "detr", "pe": detr.pop("pe"), "pe_kwargs": detr.pop("pe_kwargs")}, "detr": detr,
              "task": {"name": "detection"}, "train": {"epochs": 1}}
    ckpt.save(HERE / "train_checkpoint.pt", model=model, optimizer=opt, scheduler=sched, scaler=None,
              progress=ckpt.Progress(epoch=1, step=1), config=config)
    torch.save({"outputs": outputs(model, images, mask)},
               HERE / "train_checkpoint_outputs.pt")


if __name__ == "__main__":
    main()
