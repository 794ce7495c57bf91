"""vispe.report on a sweep folder with known numbers: mean +- std over seeds, groups of varied keys,
what is missing, and the plots (error bars = the std, curves = the mean over seeds)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vispe import report
from vispe.sweep import collect

ROOT = Path(__file__).resolve().parents[1]


def make_run(sweep, pe, seed, accs, *, vary=None, finished=True, metric="acc", device="cpu x"):
    """A run folder as vispe.sweep + train.py leave it, with accuracy ``accs = {size: value}``."""
    vary = vary or {}
    name = pe + "".join(f"+{k.rsplit('.', 1)[-1]}-{v}" for k, v in vary.items()) + f"_seed{seed}"
    run = sweep / name
    (run / pe).mkdir(parents=True)
    (run / "point.json").write_text(json.dumps({"pe": pe, "seed": seed, "vary": vary, "commit": "abc",
                                                "overrides": ["train.epochs=2"]}))
    if not finished:
        (run / pe / "checkpoint.pt").write_bytes(b"")
        return run
    summ = {"encoding": pe, "primary": metric, "task": "classification", "data": "digits_cell", "model": "vit_pico",
            "train_img_size": 32, "epochs": 2, "steps": 10, "params": 1000 + len(pe), "step_time_s": 0.02,
            "peak_mem_mb": 300.0, "peak_mem_kind": "cpu_max_rss", "train_time_s": 60.0, "device": device,
            "eval": {str(s): {"scale": s / 32, metric: a, "loss": 1 - a} for s, a in accs.items()}}
    (run / pe / "summary.json").write_text(json.dumps(summ))
    (run / "summary.json").write_text(json.dumps({"finished": True, "runtime_s": 70.0, "encodings": {pe: summ}}))
    pd.DataFrame({"epoch": [1, 2], f"test_{metric}": [accs[32] / 2, accs[32]]}).to_csv(run / pe / "metrics.csv", index=False)
    return run


@pytest.fixture
def sweep(tmp_path):
    s = tmp_path / "sw"
    make_run(s, "none", 0, {32: 0.2, 48: 0.1})
    make_run(s, "none", 1, {32: 0.4, 48: 0.1})
    make_run(s, "sine", 0, {32: 0.9, 48: 0.5})
    make_run(s, "sine", 1, {32: 0.7, 48: 0.7})
    make_run(s, "sine", 2, {32: 0.8, 48: 0.6}, finished=False)
    make_run(s, "peg", 0, {32: 0.6, 48: 0.3}, vary={"model.pe_kwargs.padding_mode": "none"})
    (s / "sweep.json").write_text(json.dumps({"invocations": [{"command": "python -m vispe.sweep --pe none,sine",
                                                               "commit": "abc", "machine": "cpu x", "started": "t0"}]}))
    return s


def test_summary_is_mean_and_sample_std_over_finished_seeds(sweep):
    summ = report.summarize(collect.collect(sweep)).set_index(["group", "eval_size"])
    assert summ.loc[("sine", 32), "mean"] == pytest.approx(0.8)  # seed 2 unfinished: not counted
    assert summ.loc[("sine", 32), "std"] == pytest.approx(np.std([0.9, 0.7], ddof=1))
    assert summ.loc[("sine", 32), "n"] == 2 and summ.loc[("none", 48), "std"] == pytest.approx(0.0)
    assert summ.loc[("peg [padding_mode=none]", 32), "n"] == 1  # a varied key makes its own group
    assert bool(summ.loc[("none", 32), "is_train_size"]) and not bool(summ.loc[("none", 48), "is_train_size"])


def test_report_files(sweep):
    text = report.write_report(sweep).read_text()
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| encoding | seeds | acc @32px (train) | acc @48px |")
    assert [line.split(" | ")[0][2:] for line in lines[1:]] == ["sine", "peg [padding_mode=none]", "none"]  # best first
    assert "| sine | 2 | 0.800 ± 0.141 | 0.600 ± 0.141 |" in text
    assert "0.600 (1 seed)" in text
    assert "`sine_seed2`: unfinished" in text and "5 of 6 runs finished" in text
    assert "python -m vispe.sweep --pe none,sine" in text
    for name in ("metric_vs_size.png", "curves.png", "results.csv"):
        assert (sweep / name).stat().st_size > 1000


def test_groups_whose_seeds_ran_on_different_threads_are_named(sweep):
    assert "Mixed devices" not in report.write_report(sweep).read_text()  # every run on "cpu x"
    make_run(sweep, "none", 2, {32: 0.3, 48: 0.1}, device="AMD EPYC, 2 cores, 1 torch threads")
    text = report.write_report(sweep).read_text()
    assert "**Mixed devices**" in text
    assert "- `none`: 1 on AMD EPYC, 2 cores, 1 torch threads; 2 on cpu x" in text
    assert "`sine`:" not in text.split("**Mixed devices**")[1]  # its seeds ran on one device


def test_plots_draw_the_means_and_stds(sweep):
    df = collect.collect(sweep)
    fig = report.plot_vs_size(report.summarize(df))
    bars = {c.get_label(): c for c in fig.axes[0].containers}  # one errorbar per group
    line, _, (segments,) = bars["sine"]
    np.testing.assert_allclose(line.get_ydata(), [0.8, 0.6])
    np.testing.assert_allclose(line.get_xdata(), [32, 48])
    half = [(s[1][1] - s[0][1]) / 2 for s in segments.get_segments()]
    np.testing.assert_allclose(half, [np.std([0.9, 0.7], ddof=1), np.std([0.5, 0.7], ddof=1)])
    hist = report.histories(sweep, df)
    assert len(hist) == 2 * 5  # 5 finished runs x 2 epochs
    curve = {line.get_label(): line for line in report.plot_curves(hist).axes[0].get_lines()}
    np.testing.assert_allclose(curve["none"].get_ydata(), [0.15, 0.3])


def test_report_of_an_empty_or_missing_folder(tmp_path, capsys):
    assert report.main([str(tmp_path / "nothing")]) == 2
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / "empty")]) == 2
    assert "holds no runs" in capsys.readouterr().err


def test_a_detection_sweep_reports_its_primary_metric(tmp_path):
    """Task-agnostic: the primary metric named by the runs' summaries (AP for detection) is the value."""
    s = tmp_path / "det"
    make_run(s, "sine", 0, {32: 0.30, 48: 0.20}, metric="AP", vary={"detr.pe_at": "input"})
    make_run(s, "sine", 1, {32: 0.40, 48: 0.10}, metric="AP", vary={"detr.pe_at": "input"})
    make_run(s, "none", 0, {32: 0.10, 48: 0.05}, metric="AP", vary={"detr.query_pos_at": "input"})
    df = collect.collect(s)
    assert set(df["metric"]) == {"AP"} and "AP" in df.columns and "detr.pe_at" in df.columns
    assert df.loc[df["run"] == "sine+pe_at-input_seed1", "value"].tolist() == [0.40, 0.10]
    text = report.write_report(s).read_text()
    assert "| encoding | seeds | AP @32px (train) | AP @48px |" in text
    assert "| sine [pe_at=input] | 2 | 0.350 ± 0.071 |" in text and "| none [query_pos_at=input] | 1 |" in text


def test_a_failed_run_says_why_and_is_not_told_to_rerun_as_it_is(sweep):
    """issue 41, item 1: a point that failed (train.py exit 2) shows train.py's error line in the
    report, which says the cause must be fixed first (a plain rerun fails the same way)."""
    run = make_run(sweep, "peg", 1, {}, finished=False)
    point = json.loads((run / "point.json").read_text())
    (run / "point.json").write_text(json.dumps({**point, "last_rc": 2}))
    (run / "train.log").write_text("\n$ python train.py --resume\ntrain.py: error: model.pe_kwargs={'x': 1}: bad\n")
    lines = report.status_lines(collect.collect(sweep), sweep)
    assert "- `peg_seed1`: failed: `train.py: error: model.pe_kwargs={'x': 1}: bad`" in lines
    assert "- `sine_seed2`: unfinished" in lines and lines[-1].startswith("Failed runs stop again until")
    (run / "train.log").write_text("$ python train.py\nTraceback (most recent call last):\n  File x\nKeyError: 'k'\n")
    assert collect.last_error(run) == "KeyError: 'k'"


def test_detector_designs_are_told_apart_by_their_labels(tmp_path):
    """issue 41, item 6: every detector variant was labelled by its encoding alone ("sine")."""
    from vispe.train import config as C
    from vispe.train.detection import DetectionTask

    cfg = lambda *o: C.load_config(ROOT / "configs/shapes_detr.yaml", list(o))  # noqa: E731
    label = DetectionTask.label
    assert label(cfg()) == "sine (dab, boxrpb)"
    assert label(cfg("detr.dec_pe=rope_axial", "detr.box_bias=null")) == "sine (dab, dec_pe=rope_axial)"
    assert label(cfg("detr.decoder=detr", "detr.box_bias=null")) == "sine"
    assert label(cfg("detr.query_relation=relation")) == "sine (dab, boxrpb, relation)"
    assert label(cfg("detr.decoder=detr", "detr.box_bias=null", "detr.pe_at={encoder: none, decoder: attn}",
                     "detr.query_pos_at=input")) == "sine (pe_at=encoder:none,decoder:attn, query_pos_at=input)"
    s = tmp_path / "det"
    for seed, (lab, ap) in enumerate([("sine (dab, boxrpb)", 0.5), ("sine (dab, dec_pe=rope_axial)", 0.4)]):
        run = make_run(s, "sine", seed, {32: ap, 48: ap / 2}, metric="AP", vary={"detr.box_bias": ["boxrpb", "null"][seed]})
        summ = json.loads((run / "sine" / "summary.json").read_text())
        (run / "sine" / "summary.json").write_text(json.dumps({**summ, "label": lab}))
    text = report.write_report(s).read_text()
    assert "| sine (dab, boxrpb) | 1 | 0.500 (1 seed) |" in text and "| sine (dab, dec_pe=rope_axial) | 1 |" in text
    assert "box_bias=" not in text  # the label shows the design: no second [box_bias=...]

