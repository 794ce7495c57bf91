"""The DETR sweep scripts of results/compare still ask for the runs their tables hold.

configs/shapes_detr.yaml changed its defaults after the tables ran (DAB-DETR + BoxRPB, a
temperature-20 sine), so a script that leaned on the old defaults would now run other designs, or
fail to build one (Conditional DETR with a box bias). Each script runs here with a ``PY`` that only
records its ``vispe.sweep`` invocations; every recorded point must be a run of the script's CSV,
resolve to that run's design, and build."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from vispe.sweep import cli
from vispe.train import config as C
from vispe.train.tasks import get_task

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "results" / "compare"
RECORDER = "import json, os, sys\nopen(os.environ['SWEEP_LOG'], 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"


def recorded_points(script: str, tmp_path: Path) -> list[tuple[str, object]]:
    """(run name, resolved config) of every point the script asks ``vispe.sweep`` for."""
    fake, log = tmp_path / "py", tmp_path / "calls.jsonl"
    fake.write_text(f"#!{sys.executable}\n{RECORDER}")
    fake.chmod(0o755)
    env = {**os.environ, "PY": str(fake), "OUT": str(tmp_path / "sweep"), "SWEEP_LOG": str(log),
           "LOCK": str(tmp_path / "no.lock")}  # no lock file: the scripts run their points directly
    subprocess.run(["bash", str(HERE / script)], env=env, check=True, capture_output=True, timeout=60)
    points = []
    for line in log.read_text().splitlines():
        argv = json.loads(line)
        assert argv[:2] == ["-m", "vispe.sweep"], argv
        args = cli.parse_args(argv[2:])
        plan = cli.plan(args)  # (it also builds every point's model)
        points += [(pt.name, C.load_config(plan.config, [*plan.overrides, *pt.overrides(plan.out)])) for pt in plan.points]
    return points


def csv_runs(name: str) -> set[str]:
    return set(pd.read_csv(HERE / "data" / name)["run"])


def builds(cfg) -> None:
    task = get_task(cfg.task)
    task.model(cfg, task.info(cfg), cfg.data.img_size or 64)


def test_table3_script_asks_for_detr_s_own_design(tmp_path):
    points = recorded_points("run_detr_table3.sh", tmp_path)
    assert {n for n, _ in points} == csv_runs("shapes_detr.csv")
    for name, cfg in points:
        assert (cfg.detr.decoder, cfg.detr.box_bias) == ("detr", None), name
        assert cfg.train.epochs == 16, f"{name}: DETR Table 3's budget (configs/shapes_detr_table3.yaml)"
        assert (cfg.task.weight_ce, cfg.task.cost_class) == (1, 1), name
        assert OmegaConf.to_container(cfg.model.pe_kwargs) == {}, f"{name}: the encoding's own settings"
    for name, cfg in points:
        if name.endswith("_seed0"):
            builds(cfg)


def test_queries_script_asks_for_the_designs_its_table_names(tmp_path):
    points = recorded_points("run_detr_queries.sh", tmp_path)
    assert {n for n, _ in points} == csv_runs("shapes_detr_queries.csv")
    for name, cfg in points:
        decoder = "conditional" if "decoder-conditional" in name else "dab"
        assert cfg.detr.decoder == decoder, name
        assert cfg.detr.box_bias == ("boxrpb" if "box_bias-boxrpb" in name else None), name
        assert cfg.detr.dec_pe == next((r for r in ("rope_axial", "rope_mixed") if r in name), None), name
        kwargs = OmegaConf.to_container(cfg.model.pe_kwargs)
        assert kwargs == ({} if decoder == "conditional" else {"temperature": 20}), name
        assert (cfg.task.weight_ce, cfg.task.cost_class) == (2, 2), name
        assert cfg.detr.init == "legacy", f"{name}: ran before issue 35's papers' initialisation"
        assert cfg.train.epochs == 16, f"{name}: DETR Table 3's budget (configs/shapes_detr_table3.yaml)"
    for name, cfg in points:
        if name.endswith("_seed0"):
            builds(cfg)


def test_same_numbers_names_what_differs():
    """same_numbers.py's DIFFERENT line says which numbers moved and by how much (the evidence of a mark)."""
    sys.path.insert(0, str(HERE))
    import same_numbers

    then = {"steps": 8, "final": {"train_loss": 2.0, "AP": 0.5}, "eval": {"64": {"loss": 1.0}}}
    now = {"steps": 8, "final": {"train_loss": 2.0, "AP": 0.5}, "eval": {"64": {"loss": 1.0 + 1e-6}}}
    assert same_numbers._where(then, now) == " (1 numbers, largest relative difference 1.0e-06 at eval.64.loss; eval.64.loss)"
    now["steps"] = 9  # a count that differs is not a rounding difference
    assert same_numbers._where(then, now).endswith("largest relative difference inf at steps; eval.64.loss, steps)")


def test_same_numbers_compares_the_old_runs_numbers():
    """A NaN equals a NaN (AP of a size class with no box, at both commits); a number only this checkout reports
    (a metric added since) is named apart and leaves the old numbers equal; a number gone or moved differs."""
    sys.path.insert(0, str(HERE))
    import same_numbers

    then = {"steps": 8, "eval": {"48": {"AP": 0.5, "APl": float("nan")}}}
    now = {"steps": 8, "eval": {"48": {"AP": 0.5, "APl": float("nan"), "AR": 0.7}}}
    assert same_numbers.compare(then, now) == ([], ["eval.48.AR"])
    assert same_numbers.compare(now, then) == (["eval.48.AR"], [])  # gone at the newer side: differs
    now["eval"]["48"]["APl"] = 0.1
    assert same_numbers.compare(then, now) == (["eval.48.APl"], ["eval.48.AR"])
    # COCOeval's -1 ("no large object here"): left out of the metrics since 4339485, the same as no number
    then = {"eval": {"48": {"AP": 0.5, "APl": -1.0}}, "final": {"test_APm": -1.0}}
    now = {"eval": {"48": {"AP": 0.5}}, "final": {}}
    assert same_numbers.compare(then, now) == ([], [])
    assert same_numbers.compare({"eval": {"48": {"AP": -1.0, "loss": -1.0}}}, {"eval": {"48": {}}}) == (
        ["eval.48.loss"], [])  # only an AP key's -1 is no score


def test_deformable_script_asks_for_the_rows_its_table_names(tmp_path):
    """run_detr_deformable.sh: every point is the deformable detector with the design its name says (plain,
    refinement, two-stage, DAB anchors; the level embedding off where named), at the shapes budget; the
    runs of its CSV (when there is one) are among its points."""
    import sys as _sys
    _sys.path.insert(0, str(HERE))
    import tables_detr

    points = recorded_points("run_detr_deformable.sh", tmp_path)
    names = {n for n, _ in points}
    assert len(points) == 24 and {n.rsplit("_seed", 1)[0] for n in names} == {r for _, r, _ in tables_detr.DEFORMABLE_ROWS}
    if (HERE / "data" / "shapes_deformable_detr.csv").is_file():
        assert csv_runs("shapes_deformable_detr.csv") <= names
    for name, cfg in points:
        kwargs = OmegaConf.to_container(cfg.detr.decoder_kwargs)
        assert cfg.detr.attention == "deformable" and cfg.train.epochs == 16, name
        assert cfg.detr.decoder == ("dab" if "decoder-dab" in name else "deformable"), name
        assert kwargs.get("with_box_refine", False) == ("with_box_refine_true" in name), name
        assert kwargs.get("two_stage", False) == ("two_stage_true" in name), name
        assert cfg.detr.level_pe == ("none" if "level_pe-none" in name else None), name
    for name, cfg in points:
        if name.endswith("_seed0") and "level_pe" not in name:
            builds(cfg)


def test_init_relation_script_runs_the_table3_recipe(tmp_path):
    """run_detr_init_relation.sh (issue 35): DAB-DETR + BoxRPB at DETR Table 3's budget, 16 epochs, since
    issue 39 from configs/shapes_detr_table3.yaml (the default configs/shapes_detr.yaml trains 12); the
    threads are the sweep's option, outside the points' configs."""
    points = recorded_points("run_detr_init_relation.sh", tmp_path)
    assert len(points) == 12  # 3 arms x 3 seeds at two threads, the papers' arm at one thread
    for name, cfg in points:
        assert (cfg.detr.decoder, cfg.detr.box_bias, cfg.train.epochs) == ("dab", "boxrpb", 16), name
        assert cfg.detr.init == ("legacy" if "init-legacy" in name else "papers"), name
        assert cfg.detr.query_relation == ("relation" if "relation" in name else None), name


def test_dino_script_asks_for_the_rows_its_tables_name(tmp_path):
    """run_dino.sh (issue 47): DINO, without denoising and without look-forward-twice at the deformable rows'
    budget (16 epochs), 3 seeds each, DAB's anchors in DINO's query formulation beside them (3 seeds), and
    DINO at 8 epochs (the candidate default), 3 seeds; each point's config is the design its name says, and
    the runs of the CSVs (when there are some) are among the points."""
    import sys as _sys
    _sys.path.insert(0, str(HERE))
    import tables_dino

    points = recorded_points("run_dino.sh", tmp_path)
    long = {n: cfg for n, cfg in points if cfg.train.epochs == 16}
    short = {n: cfg for n, cfg in points if cfg.train.epochs == 8}
    ten = {n: cfg for n, cfg in points if cfg.train.epochs == 10}
    assert len(points) == 16 and len(long) == 12 and set(short) == {f"sine+epochs-8_seed{s}" for s in range(3)}
    assert set(ten) == {"sine+epochs-10_seed0"} and ten["sine+epochs-10_seed0"].train.eval_every == 2
    assert {n.rsplit("_seed", 1)[0] for n in long} == {r for _, r, _ in tables_dino.DINO_ROWS + [tables_dino.DAB_ROW]}
    for name in ("shapes_dino.csv", "shapes_dino_short.csv"):
        if (HERE / "data" / name).is_file():
            assert csv_runs(name) <= set(long if name == "shapes_dino.csv" else {**short, **ten}), name
    for name, cfg in points:
        kwargs = OmegaConf.to_container(cfg.detr.decoder_kwargs)
        if "decoder-dab" in name:  # DAB in DINO's formulation: none of DINO's options, the default formulation
            assert (cfg.detr.attention, cfg.detr.decoder, kwargs) == ("deformable", "dab", {}), name
            task = get_task(cfg.task)
            queries = task.model(cfg, task.info(cfg), 64).queries
            assert (type(queries).__name__, queries.formulation, queries.look_forward_twice) == ("DabQueries", "dino",
                                                                                               False), name
            continue
        assert (cfg.detr.attention, cfg.detr.decoder) == ("deformable", "dino"), name
        assert kwargs.get("dn_number") == (0 if "dn_number-0" in name else 3), name
        assert kwargs.get("look_forward_twice", True) == ("look_forward_twice-false" not in name), name
    builds(short["sine+epochs-8_seed0"])
