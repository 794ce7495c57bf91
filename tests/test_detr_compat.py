"""Checkpoints written before issue 46 (tests/data/detr_compat, made by its make_fixtures.py at commit 77c7ae1)
still build, load and give the outputs they gave then, bit for bit on CPU."""
import sys
from pathlib import Path

import pytest
import torch

from vispe.models.detr import create_detr, load_detr

DATA = Path(__file__).parent / "data" / "detr_compat"
sys.path.insert(0, str(DATA))
from make_fixtures import MODELS, inputs, outputs  # noqa: E402

SAME_AS_BEFORE = ("dense_dab_boxrpb", "deformable_two_stage", "deformable_dab")


def _load(name):
    return torch.load(DATA / f"{name}.pt", weights_only=True)


#: configs whose meaning changed in issue 46 (vispe.models.detr.load.upgrade): create_detr(**config) builds today's
CHANGED = ("deformable_dab",)


@pytest.mark.parametrize("name", SAME_AS_BEFORE)
def test_a_checkpoint_written_before_the_refactor_loads_and_gives_its_outputs(name):
    saved = _load(name)
    model = load_detr(saved)
    if name not in CHANGED:  # its config builds the same model directly
        direct = create_detr(**saved["config"])
        direct.load_state_dict(saved["model"])
    images, mask = inputs()
    got = outputs(model, images, mask)
    assert sorted(got) == sorted(saved["outputs"])
    for key, want in saved["outputs"].items():
        torch.testing.assert_close(got[key], want, rtol=0, atol=1e-6, msg=f"{name} {key}")


def test_the_fixtures_cover_every_model_the_script_writes():
    assert set(MODELS) == set(SAME_AS_BEFORE)


def test_a_run_folder_checkpoint_written_before_the_refactor_loads():
    from vispe.train import checkpoint as ckpt

    state = ckpt.load(DATA / "train_checkpoint.pt")
    detr = dict(state["config"]["detr"])
    model = create_detr(3, pe=state["config"]["model"]["pe"], pe_kwargs=state["config"]["model"]["pe_kwargs"],
                        **{k: tuple(v) if k == "backbone_widths" else v for k, v in detr.items()})
    model.load_state_dict(state["model"])
    images, mask = inputs()
    want = torch.load(DATA / "train_checkpoint_outputs.pt", weights_only=True)["outputs"]
    got = outputs(model, images, mask)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-6, msg=key)


def test_an_old_dab_deformable_config_builds_todays_dino_formulation_and_the_upgrade_the_old_one():
    from vispe.models.detr.load.upgrade import upgrade_config

    saved = _load("deformable_dab")
    with pytest.raises(RuntimeError, match="tgt_embed"):
        create_detr(**saved["config"]).load_state_dict(saved["model"])
    assert upgrade_config(saved["config"])["decoder_kwargs"] == {"formulation": "legacy"}
    model = create_detr(**{k: v for k, v in saved["config"].items()})
    assert model.config["decoder_kwargs"] == {"formulation": "dino"}  # recorded: today's configs are not upgraded
    assert upgrade_config(model.config) == model.config
