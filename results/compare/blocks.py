"""The registry of results/compare/update.py: the sweep folders it merges (``SWEEPS``) and the Markdown blocks it
writes (``BLOCKS``: the name in ``<!-- BEGIN name -->`` ... ``<!-- END name -->`` -> the function that returns the
block's text from the committed CSVs). A new table: its function in a ``tables_*.py`` module, its name here.
"""
from __future__ import annotations

import constant_offset  # beside this file: the constant-offset measurement, seconds
import freshness  # beside this file
import prose_detr  # beside this file: detr_table3.md's figures in prose
import readme_figure  # beside this file: the README figure and its caption
import spread  # beside this file: the seeds' and machines' spread, reproducibility.md
import tables_dino  # beside this file: issue 47's tables, detr_dino.md
import tables_padding  # beside this file
import tables_realtime  # beside this file: issue 48's tables, detr_realtime.md
import tables_vit  # beside this file: issue 49's tables, detr_vit.md
from current import TASKS, main_table, peg_table, resolution_table, status_table  # beside this file
from tables_detr import _ap_row, deformable_table, detr_table, init_relation_table, queries_table  # beside this file
from tables_digits import relbias_init_table, today_vs_old  # beside this file
from tables_padding import leakage_table1, leakage_table4, redgreen_table  # beside this file

SWEEPS = TASKS + ("shapes_detr", "shapes_detr_queries", "shapes_detr_init", "shapes_detr_init_1thread",
                  "shapes_deformable_detr", "shapes_dino", "shapes_dino_short", "relbias_init_vit",
                  "relbias_init_torch", "shapes_rfdetr")
SWEEPS += tables_realtime.SWEEPS  # issue 48: RT-DETR and D-FINE on the shapes set

BLOCKS = {**{f"main:{t}": (lambda t=t: main_table(t)) for t in TASKS},
          **{f"resolution:{t}": (lambda t=t: resolution_table(t)) for t in TASKS},
          **{f"main:{t}_today": (lambda t=t: main_table(t, today_only=True)) for t in TASKS},
          **{f"today_vs_old:{t}": (lambda t=t: today_vs_old(t)) for t in TASKS},
          "peg": peg_table, "status": status_table, "detr": detr_table, "detr_queries": queries_table, "detr_init": init_relation_table, "detr_deformable": deformable_table, "detr_dino": lambda: tables_dino.dino_table(_ap_row), "detr_dino_epochs": tables_dino.epochs_table,
          "detr_dino_short": tables_dino.short_table, "detr_dino_step": tables_dino.step_ratio, "relbias_init": relbias_init_table, "redgreen": redgreen_table, "islam_table1": leakage_table1,
          "islam_table4": leakage_table4, "constant_offset": constant_offset.markdown,
          **{f"spread:{f.__name__}": f for f in (spread.seed_spread, spread.reruns, spread.machines)},
          "provenance": lambda: freshness.markdown(freshness.check()),
          "detr_table3_runtime": prose_detr.table3_runtime, "detr_queries_scale": prose_detr.queries_scale,
          "detr_init_reading": prose_detr.init_reading}
BLOCKS.update({"leakage_cnn": tables_padding.leakage_cnn_table, "leakage_targets": tables_padding.leakage_targets_table,
               "leakage_vit": tables_padding.leakage_vit_table})  # results/padding_leakage.md's tables (issue 53)
BLOCKS.update({"readme_caption": readme_figure.caption})  # README.md's figure caption, from its CSV (issue 53)
BLOCKS.update({"detr_realtime": lambda: tables_realtime.realtime_table(_ap_row), "detr_realtime_sizes":
               tables_realtime.sizes_table, "detr_realtime_step": tables_realtime.step_ratio,
               "detr_realtime_paired": tables_realtime.paired_table})  # issue 48
BLOCKS.update({"detr_vit": tables_vit.vit_table, "detr_vit_paired": tables_vit.paired_table,
               "detr_vit_step": tables_vit.step_ratio})  # results/compare/detr_vit.md (issue 49)
