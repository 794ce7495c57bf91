"""Bad input to train.py gives a clear error (exit code 2), and nothing already written is lost."""
from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest
import torch

from conftest import load_train_main
from vispe.data.miniature import write_miniature_cifar10
from vispe.train import checkpoint as ckpt, config as C
from vispe.train.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
TINY = ["data.kwargs.n_train=48", "data.kwargs.n_test=16", "data.batch_size=16", "model.embed_dim=32",
        "model.num_heads=2", "model.depth=1", "train.epochs=1", "train.eval_sizes=[1.0]", "train.progress=false",
        "train.compare=[]"]



main = load_train_main()


def _fingerprint(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _fails(args, capsys, *fragments) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: ")
    for f in fragments:
        assert f in err, err
    return err


def _cifar(tmp_path, *extra):
    return ["--config", str(ROOT / "configs/cifar10_vit.yaml"), "--smoke", f"train.out_dir={tmp_path / 'runs'}",
            "data.kwargs.verify_md5=false", "train.progress=false", *extra]


def test_missing_data_folder(tmp_path, capsys):
    _fails(_cifar(tmp_path, f"data.root={tmp_path / 'nowhere'}"), capsys, "data.name='cifar10'",
           "not found", str(tmp_path / "nowhere"))
    assert not (tmp_path / "runs").exists()  # nothing written


def test_truncated_data_file(tmp_path, capsys):
    write_miniature_cifar10(tmp_path / "data", n_per_batch=10)
    f = tmp_path / "data" / "cifar-10-batches-py" / "data_batch_3"
    f.write_bytes(f.read_bytes()[:500])
    _fails(_cifar(tmp_path, f"data.root={tmp_path / 'data'}"), capsys, "data_batch_3", "truncated")
    assert not (tmp_path / "runs").exists()


def test_an_evaluation_size_the_data_cannot_render_fails_before_training(tmp_path, capsys):
    _fails([f"train.out_dir={tmp_path}", *TINY, "train.eval_sizes=[1.0,0.1]"], capsys,
           "img_size=4 (train.eval_sizes scale 0.1)", "below 2 pixels")
    assert not list(tmp_path.iterdir())


def test_config_typo_and_wrong_type(tmp_path, capsys):
    _fails(["model.embeddim=64"], capsys, "unknown config key 'model.embeddim'", "model.embed_dim")
    _fails(["train.epochs=ten"], capsys, "train.epochs='ten'", "expected int")


@pytest.mark.parametrize("bad", ["model.pe=rope_mixd", "train.compare=[none,sinee]"])
def test_unknown_encoding_fails_before_anything_is_written(tmp_path, capsys, bad):
    err = _fails([f"train.out_dir={tmp_path}", *TINY, bad], capsys, "unknown encoding", "learned_abs", "rope_mixed")
    assert "did you mean" in err
    assert not list(tmp_path.iterdir())


def test_check_compatible_names_what_differs():
    cfg = C.load_config(None, TINY)
    task = get_task(cfg.task)
    info = task.info(cfg)
    model = task.model(cfg, info, 32)
    state = {"encoding": "learned_abs", "model_name": cfg.model.name, "model": model.state_dict()}
    plain = {"model": {"pe": "learned_abs", "name": cfg.model.name}}
    ckpt.check_compatible(state, model, plain)  # its own checkpoint fits
    with pytest.raises(ckpt.CheckpointError, match="written for encoding 'learned_abs', but the config asks for model.pe='rope_mixed'"):
        ckpt.check_compatible(state, model, {"model": {"pe": "rope_mixed", "name": cfg.model.name}})
    with pytest.raises(ckpt.CheckpointError, match="written for model"):
        ckpt.check_compatible(state, model, {"model": {"pe": "learned_abs", "name": "vit_small"}})
    wider = task.model(C.load_config(None, TINY + ["model.embed_dim=64"]), info, 32)
    with pytest.raises(ckpt.CheckpointError, match=r"does not fit .*qkv.weight: checkpoint \(96, 32\) vs model \(192, 64\).*more"):
        ckpt.check_compatible(state, wider, plain)
    deeper = task.model(C.load_config(None, TINY + ["model.depth=2"]), info, 32)
    with pytest.raises(ckpt.CheckpointError, match=r"missing in checkpoint: blocks\.1\."):
        ckpt.check_compatible(state, deeper, plain)


def test_incompatible_or_corrupt_checkpoint_on_resume_is_refused_and_kept(tmp_path, capsys, monkeypatch):
    base = [f"train.out_dir={tmp_path}", *TINY, "train.epochs=2"]
    monkeypatch.setenv("VISPE_TEST_SIGNAL_AT_STEP", "1:INT")  # leave an unfinished run with a checkpoint
    assert main(base + ["train.run_name=a"]) == 130
    assert main(base + ["train.run_name=b", "model.pe=none"]) == 130
    monkeypatch.delenv("VISPE_TEST_SIGNAL_AT_STEP")
    capsys.readouterr()
    _fails(base + ["train.run_name=a"], capsys, "already holds an unfinished run", "--resume")
    target = tmp_path / "a" / "learned_abs" / "checkpoint.pt"
    shutil.copy(tmp_path / "b" / "none" / "checkpoint.pt", target)  # another encoding's checkpoint
    before = _fingerprint(tmp_path / "a")
    _fails(base + ["train.run_name=a", "--resume"], capsys, "written for encoding 'none'", "model.pe='learned_abs'")
    assert _fingerprint(tmp_path / "a") == before
    target.write_bytes(target.read_bytes()[:1000])  # truncated
    before = _fingerprint(tmp_path / "a")
    _fails(base + ["train.run_name=a", "--resume"], capsys, str(target), "corrupt or truncated")
    assert _fingerprint(tmp_path / "a") == before
    # a config change that alters the model is refused before any checkpoint is read
    _fails(base + ["train.run_name=b", "model.pe=none", "model.depth=2", "--resume"], capsys,
           "model.depth: 1 -> 2", "--resume")


def test_finished_run_folder_is_never_overwritten_silently(tmp_path, capsys):
    args = [f"train.out_dir={tmp_path}", *TINY, "train.run_name=done"]
    assert main(args) == 0
    before = _fingerprint(tmp_path / "done")
    assert "learned_abs/checkpoint.pt" in before and "summary.json" in before
    _fails(args, capsys, "already holds a finished run", "--resume", "train.run_name", "train.overwrite=true")
    assert _fingerprint(tmp_path / "done") == before
    # overwrite=true moves the old run aside, whole, and starts again
    assert main(args + ["train.overwrite=true"]) == 0
    backups = list(tmp_path.glob("done.bak-*"))
    assert len(backups) == 1 and _fingerprint(backups[0]) == before
    assert (tmp_path / "done" / "summary.json").is_file()
    _fails(args + ["train.overwrite=true", "--resume"], capsys, "contradict")


def test_divergence_stops_with_a_clear_error_and_keeps_the_checkpoint(tmp_path, capsys):
    args = [f"train.out_dir={tmp_path}", *TINY, "train.epochs=3", "optim.warmup_epochs=0", "optim.lr=1e8",
            "train.log_every=1", "train.ckpt_every_steps=1"]
    assert main(args) == 1
    err = capsys.readouterr().err
    m = re.search(r"training loss is (nan|inf) at step (\d+) .*the last checkpoint is kept in (\S+)", err)
    assert m, err
    state = torch.load(m.group(3), weights_only=True)
    assert state["progress"]["step"] == int(m.group(2)) - 1  # the step before the one that diverged
    assert not (tmp_path / "default" / "learned_abs" / "summary.json").exists()


def test_resume_with_nothing_to_resume_starts_a_new_run(tmp_path, capsys):
    assert main([f"train.out_dir={tmp_path}", *TINY, "train.run_name=fresh", "--resume"]) == 0
    assert "nothing to resume" in capsys.readouterr().out
    assert (tmp_path / "fresh" / "learned_abs" / "summary.json").is_file()


def test_cuda_or_fp16_on_a_machine_without_cuda(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    _fails([f"train.out_dir={tmp_path}", *TINY, "train.device=cuda"], capsys, "train.device='cuda'", "no CUDA")
    _fails([f"train.out_dir={tmp_path}", *TINY, "train.amp=fp16"], capsys, "train.amp='fp16'", "CUDA")
    assert not list(tmp_path.iterdir())


def test_a_smoke_run_replaces_the_previous_smoke_run_but_never_a_real_one(tmp_path, capsys):
    """Issue 19, item 8: re-running a finished ``--smoke`` command works as is."""
    args = ["--smoke", f"train.out_dir={tmp_path}", *TINY]
    assert main(args) == 0
    assert main(args) == 0
    assert "replacing the previous smoke run" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.bak-*")) and (tmp_path / "default_smoke" / "summary.json").is_file()
    # a smoke command pointed at a real run's folder is refused as before, the run kept
    assert main([f"train.out_dir={tmp_path}", *TINY, "train.run_name=real"]) == 0
    before = _fingerprint(tmp_path / "real")
    capsys.readouterr()
    _fails(args + ["train.run_name=real"], capsys, "already holds a finished run", "not a smoke run")
    assert _fingerprint(tmp_path / "real") == before


def test_non_finite_inputs_stop_training_with_a_message_about_the_data(tmp_path, capsys, monkeypatch):
    """Issue 19, item 6: NaN in the training images is reported as a data problem, not only as a
    NaN loss (the loss is checked every train.log_every steps; the inputs of every step count)."""
    from vispe.train import loaders

    real = loaders.train_loader

    def poisoned(*args, **kwargs):
        for i, (x, y) in enumerate(real(*args, **kwargs)):
            if i == 1:
                x = x.clone()
                x[0, 0, 0, 0] = float("nan")
            yield x, y

    monkeypatch.setattr(loaders, "train_loader", poisoned)
    assert main([f"train.out_dir={tmp_path}", *TINY, "train.epochs=2", "train.log_every=100"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("train.py: error: ")
    assert "NaN or inf" in err and "input" in err and "data.name='digits_cell'" in err, err


# --- errors name config keys, not Python arguments (issue 28, item 7) ------------------------------
@pytest.fixture(scope="module")
def mini_coco(tmp_path_factory):
    from vispe.data.miniature_coco import write_miniature_coco

    return write_miniature_coco(tmp_path_factory.mktemp("coco"), n_images=3, seed=0)


def _detr(tmp_path, coco, *extra):
    """configs/shapes_detr.yaml (sine with DAB-DETR's temperature 20, small_cnn widths [16, 32, 64]) on a miniature COCO."""
    return ["--config", str(ROOT / "configs/shapes_detr.yaml"), "data.name=coco", f"data.root={coco}",
            "data.img_size=48", "data.max_size=80", f"train.out_dir={tmp_path}", "train.progress=false", *extra]


@pytest.mark.parametrize("extra, fragments, python_words", [
    (["model.pe=learned_abs"],  # the file's sine setting is not one of learned_abs's
     ["unexpected setting model.pe_kwargs.temperature", "model.pe_kwargs={}"], "keyword argument 'temperature'"),
    (["model.pe=learned_abs", "model.pe_kwargs={}"],  # replaces the file's settings; the table needs a grid
     ["'detr.grid'", "set detr.grid=", "feature grid"], "argument: 'grid'"),
    (["detr.backbone=resnet18"],
     ["detr.backbone_widths=[16, 32, 64]: only detr.backbone='small_cnn' takes widths", "detr.backbone_widths=null"],
     "backbone_widths=(16, 32, 64)"),
], ids=["pe_kwargs", "grid", "backbone_widths"])
def test_detr_build_errors_name_the_config_keys(tmp_path, capsys, mini_coco, extra, fragments, python_words):
    err = _fails(_detr(tmp_path, mini_coco, *extra), capsys, *fragments)
    assert python_words not in err
    assert not list(tmp_path.iterdir())  # refused before anything is written


def test_a_grid_sized_encoding_builds_once_the_named_key_is_set(mini_coco):
    cfg = C.load_config(ROOT / "configs/shapes_detr.yaml", ["model.pe=learned_abs", "model.pe_kwargs={}",
                                                           "detr.grid=[6,6]"])
    assert dict(cfg.model.pe_kwargs) == {}  # `{}` replaced the file's {temperature: 20}
    task = get_task(cfg.task)
    model = task.model(cfg, task.info(C.load_config(ROOT / "configs/shapes_detr.yaml",
                                                    ["data.name=coco", f"data.root={mini_coco}"])), 48)
    assert model.pe_name == "learned_abs" and tuple(model.pe.grid) == (6, 6)
    added = C.load_config(ROOT / "configs/shapes_detr.yaml", ["model.pe_kwargs.normalize=true"])
    assert dict(added.model.pe_kwargs) == {"temperature": 20, "normalize": True}  # a sub-key still adds one


def test_a_list_key_given_one_word_says_how_to_write_a_list(capsys):
    err = _fails(["train.compare=none"], capsys, "config key train.compare='none'", "train.compare=[none]",
                 "train.compare=[]")
    assert "AnyNode" not in err and "ListConfig" not in err


def test_an_unknown_encoding_suggests_the_names_it_is_part_of(tmp_path, capsys):
    err = _fails([f"train.out_dir={tmp_path}", *TINY, "model.pe=rope"], capsys, "unknown encoding 'rope'")
    assert "did you mean rope_axial, rope_mixed" in err
    from vispe.sweep.cli import main as sweep_main

    assert sweep_main(["--config", str(ROOT / "configs/digits_cell.yaml"), "--pe", "rope,sine", "--seeds", "0"]) == 2
    err = capsys.readouterr().err
    assert "'rope': did you mean rope_axial, rope_mixed" in err, err
