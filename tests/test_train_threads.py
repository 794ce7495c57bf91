"""train.threads: torch's CPU threads in a training process (vispe.train.threads)."""
import os

import pytest
import torch

from vispe.train.config import ConfigError, load_config
from vispe.train.threads import apply_threads, auto_threads


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_auto_uses_every_core_only_when_waiting_threads_sleep(monkeypatch, restore_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert auto_threads() == 1  # spinning OpenMP threads: one, so another process cannot stall them
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert auto_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert auto_threads() == 3  # the environment wins (torchrun sets 1)
    assert apply_threads(0) == 3 and torch.get_num_threads() == 3
    assert apply_threads(1) == 1 and torch.get_num_threads() == 1


def test_bad_thread_counts_are_refused():
    with pytest.raises(ValueError, match="train.threads=-1"):
        apply_threads(-1)
    with pytest.raises(ConfigError, match="train.threads=-2"):
        load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "default.yaml"), ["train.threads=-2"])
    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "default.yaml"), ["train.threads=1"])
    assert cfg.train.threads == 1


def test_train_py_applies_the_setting(tmp_path, restore_threads):
    import json

    from conftest import load_train_main

    tiny = ["data.kwargs.n_train=32", "data.kwargs.n_test=16", "data.batch_size=16", "model.embed_dim=32",
            "model.num_heads=2", "model.depth=1", "train.epochs=1", "train.eval_sizes=[1.0]",
            "train.progress=false", "train.compare=[]"]
    torch.set_num_threads(2)
    assert load_train_main()([f"train.out_dir={tmp_path}", *tiny, "train.threads=1", "train.run_name=t"]) == 0
    summary = json.loads((tmp_path / "t" / "learned_abs" / "summary.json").read_text())
    assert summary["device"].endswith(", 1 torch threads") and torch.get_num_threads() == 1
