"""run_rfdetr.sh (issue 49) asks for the rows results/compare/detr_vit.md names: the RF-DETR-style detector at
native aspect, trained on square-resized images (configs/shapes_rfdetr_square.yaml's one difference), and with
rope_mixed in place of its table, 3 seeds each, 16 epochs; the runs of its CSV are among the points."""
from __future__ import annotations

import sys

from omegaconf import OmegaConf

from tests.test_compare_scripts import HERE, ROOT, builds, csv_runs, recorded_points
from vispe.train import config as C


def test_rfdetr_script_asks_for_the_rows_its_table_names(tmp_path):
    sys.path.insert(0, str(HERE))
    import tables_vit

    points = dict(recorded_points("run_rfdetr.sh", tmp_path))
    rows = {r for _, r in tables_vit.ROWS}
    assert len(points) == 9 and {n.rsplit("_seed", 1)[0] for n in points} == rows
    assert {int(n.rsplit("_seed", 1)[1]) for n in points} == {0, 1, 2}
    if (HERE / "data" / "shapes_rfdetr.csv").is_file():
        assert csv_runs("shapes_rfdetr.csv") <= set(points)
    square = C.load_config(ROOT / "configs/shapes_rfdetr_square.yaml", [])
    for name, cfg in points.items():
        assert (cfg.detr.decoder, cfg.train.epochs, cfg.data.max_size) == ("rfdetr", 16, 96), name
        assert cfg.model.pe == ("rope_mixed" if name.startswith("rope_mixed") else "learned_abs"), name
        assert cfg.data.train_augment == ("square" if "train_augment-square" in name else False), name
    # the square row is configs/shapes_rfdetr_square.yaml but for the bookkeeping keys of a sweep's run
    mine = OmegaConf.to_container(points["learned_abs+train_augment-square_seed0"])
    theirs = OmegaConf.to_container(square)
    for key in ("task", "data", "model", "detr", "optim"):
        assert mine[key] == theirs[key], key
    builds(points["learned_abs+train_augment-square_seed0"])
