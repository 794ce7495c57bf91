"""The sweep runner end to end (two encodings, one seed, a few steps), its resume, the submitit path
(submitit's local executor), the tidy table, and the checks it makes before running anything."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

from vispe.sweep import cli, collect, grid, trace

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "digits_cell.yaml")
TINY = ["train.epochs=2", "data.batch_size=16", "data.train_subset=48", "data.test_subset=32",
        "data.kwargs.n_train=64", "data.kwargs.n_test=32", "train.eval_sizes=[1.0,1.5]", "model.depth=1"]


def blob(data: bytes) -> str:
    """git's blob hash (``git hash-object``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A sweep of none and learned_abs: none alone first, locally, killed (SIGKILL) at step 4 of 6;
    then both through submitit's local executor (none resumes, learned_abs runs); then both
    locally again (nothing left to run). Three train.py processes in all."""
    pytest.importorskip("submitit")
    out = tmp_path_factory.mktemp("sweep") / "cell"
    argv = ["--config", CONFIG, "--pe", "none,learned_abs", "--seeds", "0", "--out", str(out), "--threads", "1", *TINY]
    mp = pytest.MonkeyPatch()
    mp.setenv("VISPE_TEST_SIGNAL_AT_STEP", "4:KILL")  # the point dies at step 4 (epoch 2 of 2)
    first = cli.main(argv[:4] + ["--pe", "none"] + argv[6:])
    mp.delenv("VISPE_TEST_SIGNAL_AT_STEP")
    killed = collect.collect(out)
    second = cli.main([*argv, "--launcher", "submitit-local", "--timeout-min", "5"])
    third = cli.main(argv)
    mp.undo()
    return out, argv, (first, second, third), killed


@pytest.mark.slow
def test_sweep_runs_resumes_and_skips(swept):
    out, _, (first, second, third), killed = swept
    assert first == 1 and second == 0 and third == 0
    assert list(killed["status"]) == ["failed"]  # the killed point: exit code -9, a checkpoint, no summary
    log = (out / "none_seed0" / "train.log").read_text()
    assert "resumed from" in log and log.count("$ ") == 2  # resumed once, not run a third time
    assert (out / "learned_abs_seed0" / "train.log").read_text().count("$ ") == 1
    inv = json.loads((out / "sweep.json").read_text())["invocations"]
    assert [i["to_run"] for i in inv] == [["none_seed0"], ["none_seed0", "learned_abs_seed0"], []]
    assert [i["launcher"] for i in inv] == ["local", "submitit-local", "local"]
    assert all(i["commit"] and "cores" in i["machine"] for i in inv)


@pytest.mark.slow
def test_submitit_local_executor_path(swept):
    out = swept[0]
    jobs = json.loads((out / "jobs.json").read_text())
    assert sorted(jobs) == ["learned_abs_seed0", "none_seed0"]
    assert {j["launcher"] for j in jobs.values()} == {"submitit-local"}
    logs = list((out / "submitit").glob("*_log.out"))
    assert len(logs) == 2  # submitit's own job logs, one per point


@pytest.mark.slow
def test_tidy_table_matches_the_run_summaries(swept):
    out = swept[0]
    df = pd.read_csv(out / "results.csv")
    assert sorted(set(df["encoding"])) == ["learned_abs", "none"] and set(df["status"]) == {"finished"}
    assert len(df) == 4 and sorted(set(df["eval_size"])) == [32, 48]
    for key in ("train.epochs", "data.batch_size", "train.eval_sizes", "model.depth"):
        assert key in df.columns  # every override is a column
    for row in df.itertuples():
        summ = json.loads((out / row.run / row.encoding / "summary.json").read_text())
        assert row.value == summ["eval"][str(row.eval_size)]["acc"] and row.metric == "acc"
        assert row.is_train_size == (row.eval_size == 32) and row.seed == 0
        assert row.params == summ["params"] > 0 and row.steps == 6
        assert row.step_time_s > 0 and row.peak_mem_mb > 50 and row.peak_mem_kind == "cpu_max_rss"
    params = df.drop_duplicates("encoding").set_index("encoding")["params"]
    assert params["learned_abs"] - params["none"] == 8 * 8 * 64 + 64  # the table + the class token's vector
    # what the runs used (vispe.sweep.trace): learned_abs ran in one part; none was SIGKILLed, then resumed, so its
    # record is refused (the killed part's files are unknown)
    used = trace.read(out / "learned_abs_seed0")
    assert used is not None and trace.read(out / "none_seed0") is None
    assert {"train.py", "configs/digits_cell.yaml", "vispe/train/engine.py"} <= set(used)
    assert not any(p.startswith((".venv/", "vispe/sweep/")) for p in used)
    assert all(used[p] == blob((ROOT / p).read_bytes()) for p in used)


def test_grid_order_names_and_vary():
    pts = grid.expand(["none", "peg"], [0, 1], grid.parse_vary(["model.pe_kwargs.padding_mode=zeros,none"]))
    assert [p.name for p in pts[:4]] == ["none+padding_mode-zeros_seed0", "peg+padding_mode-zeros_seed0",
                                         "none+padding_mode-none_seed0", "peg+padding_mode-none_seed0"]
    assert len(pts) == 8 and {p.seed for p in pts[4:]} == {1}
    o = pts[3].overrides(Path("/s"))
    assert "model.pe=peg" in o and "train.seed=0" in o and "model.pe_kwargs.padding_mode=none" in o
    assert "train.out_dir=/s" in o and f"train.run_name={pts[3].name}" in o
    (key, values), = grid.parse_vary(["detr.pe_at={encoder: none, decoder: attn},input"])  # braces keep commas
    assert key == "detr.pe_at" and values == ["{encoder: none, decoder: attn}", "input"]
    assert grid.Point("sine", 0, ((key, values[0]),)).name == "sine+pe_at-encoder_none_decoder_attn_seed0"
    with pytest.raises(ValueError, match="unbalanced"):
        grid.split_list("a,[b", "--vary")


@pytest.mark.parametrize("extra, message", [
    (["--pe", "nonsense"], "unknown encoding(s) nonsense"),
    (["--pe", "none", "--seeds", "0,x"], "--seeds='0,x'"),
    (["--pe", "none", "train.seed=3"], "train.seed"),
    (["--pe", "none", "--vary", "model.pe=a,b"], "--pe for model.pe"),
    (["--pe", "none", "train.epochz=3"], "train.epochz"),
    (["--pe", "none", "--vary", "train.epochs=1,"], "--vary train.epochs"),
])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, capsys, extra, message):
    out = tmp_path / "never"
    assert cli.main(["--config", CONFIG, "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_dry_run_lists_states(swept, capsys):
    argv = swept[1]
    assert cli.main([*argv, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "none_seed0" in text and "finished" in text and "0 to run" in text


@pytest.mark.slow
def test_trained_model_of_a_run_and_its_float16_weights_file(swept, tmp_path):
    import torch

    from vispe.analysis import trained

    run = swept[0] / "learned_abs_seed0" / "learned_abs"
    model, cfg = trained.load_run_model(run)
    assert cfg["model"]["pe"] == "learned_abs" and not model.training
    state = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
    torch.testing.assert_close(model.state_dict()["pos_embed"], state["pos_embed"])
    f = trained.export_weights(run, tmp_path / "w.pt")
    small, _ = trained.load_weights(f)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(small(x), model(x), atol=2e-2, rtol=2e-2)  # float16 storage
    with pytest.raises(ValueError, match="export_weights"):
        trained.load_weights(run / "checkpoint.pt")


@pytest.mark.slow
def test_sigterm_to_the_sweep_stops_the_run_with_a_checkpoint(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "stop"
    argv = [sys.executable, "-m", "vispe.sweep", "--config", CONFIG, "--pe", "none,learned_abs", "--out", str(out),
            "--threads", "1", *TINY, "train.epochs=200"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = out / "none_seed0" / "train.log"
    deadline = time.time() + 240
    while time.time() < deadline and not (log.is_file() and "[none] epoch 1/200" in log.read_text()):
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    text = proc.communicate(timeout=240)[0]
    assert proc.returncode == 130, text
    assert "SIGTERM: stopping after this step" in log.read_text()
    assert (out / "none_seed0" / "none" / "checkpoint.pt").is_file()
    assert not (out / "learned_abs_seed0" / "train.log").exists()  # the sweep stopped there
    df = collect.collect(out)
    assert df.set_index("run")["status"].to_dict() == {"none_seed0": "unfinished", "learned_abs_seed0": "not started"}
    assert json.loads((out / "none_seed0" / "point.json").read_text())["last_rc"] == 130
    assert os.environ.get("VISPE_TEST_SIGNAL_AT_STEP") is None


def test_merge_tables_keeps_runs_whose_folders_are_gone():
    """A committed table and a fresh one: runs only in the committed table stay, a run finished only
    there is not replaced by a fresh unfinished attempt, otherwise the fresh rows win."""
    def rows(run, status, value, sizes=(16, 32)):
        return [{"run": run, "status": status, "eval_size": s, "value": value} for s in sizes]
    kept = pd.DataFrame(rows("a_seed0", "finished", 0.1) + rows("b_seed0", "finished", 0.2)
                        + rows("c_seed0", "running", 0.0, (32,)))
    fresh = pd.DataFrame(rows("b_seed0", "running", 0.0, (32,)) + rows("c_seed0", "finished", 0.3)
                         + rows("d_seed0", "finished", 0.4))
    out = collect.merge_tables(kept, fresh)
    assert list(dict.fromkeys(out["run"])) == ["a_seed0", "b_seed0", "c_seed0", "d_seed0"]
    by_run = out.groupby("run").agg(status=("status", "first"), value=("value", "first"), n=("value", "size"))
    assert by_run.to_dict("index") == {"a_seed0": {"status": "finished", "value": 0.1, "n": 2},
                                       "b_seed0": {"status": "finished", "value": 0.2, "n": 2},
                                       "c_seed0": {"status": "finished", "value": 0.3, "n": 2},
                                       "d_seed0": {"status": "finished", "value": 0.4, "n": 2}}
    assert collect.merge_tables(None, fresh).equals(fresh) and collect.merge_tables(kept, fresh.iloc[:0]).equals(kept)


def test_config_settings_follow_its_encoding_and_dry_run_builds_every_point(tmp_path, capsys):
    """issue 41, item 1: shapes_detr.yaml's header command (`--pe none,sine`) runs `none` without the
    file's sine settings (temperature 20), as train.compare does; settings given on the sweep's command
    line apply to every point, and a point that cannot take them is refused by --dry-run, naming it."""
    from vispe.train import config as C

    detr = str(ROOT / "configs" / "shapes_detr.yaml")
    out = tmp_path / "sw"
    base = ["--config", detr, "--pe", "none,sine", "--seeds", "0", "--out", str(out), "--dry-run"]
    assert cli.main(base) == 0
    text = capsys.readouterr().out
    assert "none runs without them" in text and "model built" in text and "none_seed0" in text
    args = cli.parse_args(base)
    plan = cli.plan(args)
    assert plan.labels == {"none_seed0": "none (dab, boxrpb)", "sine_seed0": "sine (dab, boxrpb)"}  # item 6
    points = {p.pe: p for p in plan.points}
    cfg = {pe: C.load_config(detr, p.overrides(out)) for pe, p in points.items()}
    assert dict(cfg["none"].model.pe_kwargs) == {} and dict(cfg["sine"].model.pe_kwargs) == {"temperature": 20}
    for explicit in (["model.pe_kwargs.temperature=30"], ["--vary", "model.pe_kwargs.temperature=20,30"]):
        assert cli.main([*base, *explicit]) == 2
        err = capsys.readouterr().err
        assert "cannot be built; nothing was run" in err and "model.pe_kwargs" in err and "takes no settings" in err
        assert [line.split(":")[0].strip() for line in err.splitlines()[1:]] == \
            ([f"none+temperature-{t}_seed0" for t in (20, 30)] if "--vary" in explicit else ["none_seed0"])
    assert not out.exists()
    assert cli.main(["--config", str(ROOT / "configs" / "shape_detr.yaml"), "--pe", "none", "--dry-run"]) == 2
    assert "did you mean 'configs/shapes_detr.yaml'" in capsys.readouterr().err.replace(str(ROOT) + "/", "")
