"""Figures in prose cannot drift from their data (issue 53).

Two rules, over the results pages, the docs pages, README.md and the configs' headers:

- every ``mean ± std`` figure (or ``+-``) outside a block that ``update.py`` writes is either a cell of such a
  block (on any page: the blocks are written from the CSVs, and ``test_results_pages.py`` checks that they equal
  what update.py writes now) or recomputed here from its CSV (``RECOMPUTED``);
- the other figures the audit of issue 53 found wrong (ranges, seconds, sample counts) are recomputed from
  their CSVs here (``SAID``), sentence by sentence.

A figure with no CSV behind it gets one (``results/bench_detr_default.csv``,
``data/digits_content_position_centred_at_9430049.csv``) or goes.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "results" / "compare" / "data"
sys.path.insert(0, str(ROOT / "results" / "compare"))
import prose_detr  # noqa: E402  (results/compare/prose_detr.py: detr_table3.md's figures)

BLOCK = re.compile(r"<!-- BEGIN ([\w.:-]+) -->\n.*?<!-- END \1 -->", re.S)
PM = re.compile(r"-?\d+\.\d+ (?:±|\+-) \d+\.\d+")
GLOBS = ("results/*.md", "results/compare/*.md", "docs/*.md", "docs/guides/*.md", "README.md", "configs/*.yaml")


def pages() -> list[Path]:
    return sorted({p for g in GLOBS for p in ROOT.glob(g)})


def _norm(figure: str) -> str:
    return figure.replace("+-", "±")


def generated_cells(texts) -> set[str]:
    """Every ``mean ± std`` inside a generated block of ``texts``."""
    return {_norm(f) for t in texts for m in BLOCK.finditer(t) for f in PM.findall(m.group(0))}


def prose_figures(text: str) -> list[str]:
    """Every ``mean ± std`` of ``text`` outside its generated blocks."""
    return [_norm(f) for f in PM.findall(BLOCK.sub("", text))]


# ------------------------------------------------------------------ recomputations from the CSVs
def _ms(s: pd.Series, digits: int = 3) -> str:
    return f"{s.mean():.{digits}f} ± {s.std():.{digits}f}"


def _default_run() -> pd.DataFrame:
    """The 15-epoch default of configs/shapes_detr.yaml, seeds 0 and 1 (results/bench_detr_default.csv)."""
    df = pd.read_csv(ROOT / "results" / "bench_detr_default.csv")
    return df[df["epochs"] == 15]


def _centred_9430049(encoding: str, col: str) -> str:
    df = pd.read_csv(DATA / "digits_content_position_centred_at_9430049.csv")
    return _ms(df[(df["encoding"] == encoding) & (df["eval_size"] == 32)][col])


def _last_train_acc(encoding: str) -> str:
    """Train accuracy at the last epoch of the uncentred default runs of today's digits_content_position grid."""
    h = pd.read_csv(DATA / "digits_content_position_today_curves.csv")
    last = h.sort_values("epoch").groupby("run").tail(1)
    return _ms(last[last["run"].str.fullmatch(rf"{encoding}_seed\d")]["train_acc"], 2)


def _at_scale(csv: str, encoding: str, scale: float) -> str:
    df = pd.read_csv(DATA / f"{csv}.csv")
    return _ms(df[(df["encoding"] == encoding) & (df["scale"] == scale)]["acc"])


RECOMPUTED = {  # (page, figure) -> the figure from its CSV
    ("configs/shapes_detr.yaml", "0.501 ± 0.060"): lambda: _ms(_default_run()["AP"]),
    ("configs/shapes_detr.yaml", "0.901 ± 0.019"): lambda: _ms(_default_run()["AP50"]),
    ("docs/training.md", "0.501 ± 0.060"): lambda: _ms(_default_run()["AP"]),
    ("results/bench_detr_default.md", "0.501 ± 0.060"): lambda: _ms(_default_run()["AP"]),
    ("results/compare/constant_offset.md", "0.796 ± 0.018"): lambda: _centred_9430049("sine", "acc"),
    ("results/compare/constant_offset.md", "0.806 ± 0.020"): lambda: _centred_9430049("sincos2d", "acc"),
    ("results/compare/constant_offset.md", "0.977 ± 0.025"): lambda: _centred_9430049("sine", "train_acc"),
    ("results/compare/constant_offset.md", "0.993 ± 0.005"): lambda: _centred_9430049("sincos2d", "train_acc"),
    ("results/compare/rope_scaling.md", "0.796 ± 0.018"): lambda: _centred_9430049("sine", "acc"),
    ("results/compare/rope_scaling.md", "0.806 ± 0.020"): lambda: _centred_9430049("sincos2d", "acc"),
    ("results/compare/rope_scaling.md", "0.65 ± 0.23"): lambda: _last_train_acc("sine"),
    ("results/compare/rope_scaling.md", "0.63 ± 0.32"): lambda: _last_train_acc("sincos2d"),
    ("results/compare/resolution_transfer.md", "0.786 ± 0.105"): lambda: _at_scale("digits_class", "rope_axial", 1.25),
}


def unchecked(pages_text: dict[str, str]) -> list[str]:
    """``page: figure`` for each prose figure that is neither a generated cell nor recomputed."""
    cells = generated_cells(pages_text.values())
    return [f"{page}: {f}" for page, text in pages_text.items() for f in prose_figures(text)
            if f not in cells and (page, f) not in RECOMPUTED]


def _texts() -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in pages()}


def test_every_mean_and_std_in_prose_is_a_generated_cell_or_recomputed_from_its_csv():
    texts = _texts()
    assert sum(len(prose_figures(t)) for t in texts.values()) > 20  # the scan finds the figures at all
    assert not unchecked(texts), unchecked(texts)


@pytest.mark.parametrize("page, figure", sorted(RECOMPUTED))
def test_a_recomputed_figure_is_quoted_where_it_is_listed_and_equals_its_csv(page, figure):
    assert figure in prose_figures((ROOT / page).read_text()), f"{page} no longer quotes {figure}: drop the entry"
    assert RECOMPUTED[page, figure]() == figure


def test_a_planted_wrong_figure_is_found():
    texts = _texts()
    page = "docs/detection.md"
    assert "0.500 ± 0.010" in texts[page] and not unchecked(texts)
    planted = {**texts, page: texts[page].replace("0.500 ± 0.010", "0.500 ± 0.011", 1)}
    assert unchecked(planted) == [f"{page}: 0.500 ± 0.011"]
    inside = {**texts, "x.md": "<!-- BEGIN a -->\n0.123 ± 0.456\n<!-- END a -->\nprose 0.123 ± 0.456 and 0.1 +- 0.2\n"}
    assert unchecked(inside) == ["x.md: 0.1 ± 0.2"]  # a cell of a block checks the prose; the other figure is found


# ------------------------------------------------------------------ the audit's other figures, sentence by sentence
def _extrapolation() -> pd.DataFrame:
    return pd.read_csv(DATA / "extrapolation_digits_cell.csv")


def _extrapolation_samples() -> str:
    df = _extrapolation()
    n = df.groupby("height")["test_samples"].max()
    assert 96 not in n.index
    small = sorted(set(df[df["height"] <= 64]["test_samples"]))
    return f"All {small[0]:,} test images at 16-64 px and the non-square sizes, the first {n[128]} at 128 px (no 96 px evaluation"


def _extrapolation_trainings() -> str:
    runs = _extrapolation().drop_duplicates(["encoding", "seed"])
    return f"{len(runs)} trainings of {runs['train_time_s'].min():.1f}-{runs['train_time_s'].max():.1f} s"


def _extrapolation_interpolating() -> str:
    df = _extrapolation()
    keep = [("comrope", "as trained"), ("liere", "scale_0_to_1"), ("rope_axial", "pi"), ("rope_mixed", "pi"),
            ("string", "pi")]
    sq = df[(df["height"] == df["width"]) & df["height"].isin([48, 64, 128])]
    means = {(e, v, h): g["acc"].mean() for (e, v, h), g in sq.groupby(["encoding", "variant", "height"])}
    got = {k: m for k, m in means.items() if k[:2] in keep}
    assert len(got) == 3 * len(keep)
    lo, hi = min(got.values()), max(got.values())
    below = sorted((k for k, m in got.items() if round(m, 3) < 1.0), key=lambda k: k[2])
    assert [(k[0], k[2]) for k in below] == [("comrope", 48), ("string", 128)], below
    return (f"keep {lo:.3f}-{hi:.3f} at 48, 64 and 128 px (ComRoPE {got[below[0]]:.3f} at 48 px, STRING with PI "
            f"{got[below[1]]:.3f} at 128 px, the rest 1.000)")


def _extrapolation_relbias() -> str:
    df = _extrapolation()
    r = df[(df["encoding"] == "relbias") & (df["variant"] == "as trained")]
    s2 = r[r["seed"] == 2].set_index(["height", "width"])["acc"]
    held = r[(r["seed"] < 2) & (r["height"] >= 24)]["acc"]
    other = [s2[(h, h)] for h in (16, 48, 64, 128)]
    return (f"relbias's seeds 0 and 1 hold {held.min():.2f}-{held.max():.2f} from 24 px up (its table resized "
            f"bicubically), its seed 2 trained to {s2[(32, 32)]:.3f} at 32 px and is near chance at the other square "
            f"sizes ({min(other):.3f}-{max(other):.3f} at 16, 48, 64 and 128 px) except {s2[(24, 24)]:.3f} at 24 px, "
            f"and {s2[(24, 48)]:.3f} at 24 x 48")


def _extrapolation_learned() -> str:
    df = _extrapolation()
    a = df[(df["encoding"] == "learned_abs") & (df["variant"] == "as trained") & (df["height"] >= 48)
           & (df["height"] == df["width"])]
    m = a.groupby("height")["acc"].mean()
    return f"learned_abs keeps means of {m.min():.3f}-{m.max():.3f} above the training size (48-128 px)"


def _default_seconds() -> str:
    d = pd.read_csv(DATA / "shapes_detr_init.csv")
    r = d[(d["run"] == "sine+init-papers_seed0") & d["is_train_size"].astype(bool)].iloc[0]
    return f"seed 0: AP {r['AP']:.3f} in {r['wall_s']:.0f} s"


def _detection_init() -> str:
    two, one, old = prose_detr._csv("shapes_detr_init"), prose_detr._csv("shapes_detr_init_1thread"), \
        prose_detr._csv("shapes_detr_queries")
    p2, l2 = prose_detr._at(two, "sine+init-papers"), prose_detr._at(two, "sine+init-legacy")
    p1, l1 = prose_detr._at(one, "sine+init-papers"), prose_detr._at(old, "sine+decoder-dab+box_bias-boxrpb")
    return (f"at two threads {_ms(p2)} AP with the papers', {_ms(l2)} with `\"legacy\"`; at one thread {_ms(p1)} "
            f"and {_ms(l1)}")


SAID = {  # (page, what it says) -> the sentence from the CSV
    "results/compare/extrapolation.md: samples": ("results/compare/extrapolation.md", _extrapolation_samples),
    "results/compare/extrapolation.md: trainings": ("results/compare/extrapolation.md", _extrapolation_trainings),
    "results/compare/extrapolation.md: interpolating": ("results/compare/extrapolation.md",
                                                        _extrapolation_interpolating),
    "results/compare/extrapolation.md: relbias": ("results/compare/extrapolation.md", _extrapolation_relbias),
    "results/compare/extrapolation.md: learned_abs": ("results/compare/extrapolation.md", _extrapolation_learned),
    "results/bench_detr_default.md: before": ("results/bench_detr_default.md", _default_seconds),
    "docs/detection.md: initialisation": ("docs/detection.md", _detection_init),
}


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("name", sorted(SAID))
def test_the_audits_figures_are_what_their_csv_gives(name):
    page, sentence = SAID[name]
    want = sentence()
    assert _flat(want) in _flat((ROOT / page).read_text()), f"{page} should say: {want}"


def test_the_default_runs_table_equals_its_csv():
    """results/bench_detr_default.md's timing table, row by row, against results/bench_detr_default.csv."""
    text = (ROOT / "results" / "bench_detr_default.md").read_text()
    rows = [[c.strip(" *") for c in line.strip("|").split("|")] for line in text.splitlines()
            if re.match(r"^\| 1[25] epochs, one thread", line)]
    df = pd.read_csv(ROOT / "results" / "bench_detr_default.csv")
    assert len(rows) == len(df) == 4
    for cells, (_, r) in zip(rows, df.iterrows()):
        assert cells[0].startswith(f"{r['epochs']} epochs, one thread (`{r['commit'][:7]}`")
        assert cells[1:9] == [str(r["seed"]), f"{r['wall_s']:.1f}", f"{r['train_s']:.1f}", f"{r['steps']:,}",
                              f"{r['ms_per_step']:.1f}", f"{r['AP']:.3f}", f"{r['AP50']:.3f}",
                              f"{r['AP_0.75x']:.3f} / {r['AP_1.5x']:.3f}"], cells
