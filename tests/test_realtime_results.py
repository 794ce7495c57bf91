"""results/compare/run_realtime.sh (issue 48) asks for the rows detr_realtime.md's table names: RT-DETR with
AIFI's sin-cos (mask-aware, as configs/shapes_rtdetr.yaml) and with rope_mixed, and D-FINE, 3 seeds each at
one thread, evaluated at 0.75x / 1x / 1.5x; each point's config is the design its row says and builds; the
runs of the committed CSVs (when there are some) are among the points."""
from __future__ import annotations

import sys

from omegaconf import OmegaConf
from test_compare_scripts import HERE, builds, csv_runs, recorded_points


def test_realtime_script_asks_for_the_rows_its_table_names(tmp_path):
    sys.path.insert(0, str(HERE))
    import tables_realtime

    points = recorded_points("run_realtime.sh", tmp_path)
    by_name: dict[str, list] = {}
    for name, cfg in points:
        by_name.setdefault("dfine" if "dfine" in OmegaConf.to_container(cfg.detr.decoder_kwargs) else "rtdetr",
                           []).append((name, cfg))
    assert sorted(n for n, _ in by_name["rtdetr"]) == sorted(f"{pe}_seed{s}" for pe in ("sincos2d", "rope_mixed")
                                                             for s in range(3))
    assert sorted(n for n, _ in by_name["dfine"]) == [f"sincos2d_seed{s}" for s in range(3)]
    rows = {(csv, run) for _, csv, run, _ in tables_realtime.ROWS if csv != "shapes_dino"}
    assert rows == {("shapes_rtdetr", "sincos2d"), ("shapes_rtdetr", "rope_mixed"), ("shapes_dfine", "sincos2d")}
    for name, cfg in points:
        assert cfg.train.epochs == 16 and list(cfg.train.eval_sizes) == [0.75, 1.0, 1.5], name
        assert cfg.detr.decoder == "rtdetr" and cfg.model.pe == name.split("_seed")[0], name
        assert cfg.model.pe_kwargs == ({"mask_aware": True} if cfg.model.pe == "sincos2d" else {}), name
    for csv, design in (("shapes_rtdetr.csv", "rtdetr"), ("shapes_dfine.csv", "dfine")):
        if (HERE / "data" / csv).is_file():
            assert csv_runs(csv) <= {n for n, _ in by_name[design]}, csv
    builds(by_name["dfine"][0][1])
