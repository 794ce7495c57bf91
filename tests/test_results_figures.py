"""The README figure (issue 53): drawn from its CSV by a command, its legend outside the axes (it covers no curve),
and its caption's figures recomputed here from the CSV, independently of the code that writes it."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import matplotlib
import pandas as pd

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "results" / "compare"))
import readme_figure  # noqa: E402  (results/compare/readme_figure.py)

from vispe import report  # noqa: E402

CSV = ROOT / "results" / "compare" / "data" / "digits_cell_today.csv"


def test_the_legend_is_outside_the_axes_and_covers_no_curve():
    df = pd.read_csv(CSV)
    fig = report.plot_vs_size(report.summarize(df))
    fig.canvas.draw()
    ax, legend = fig.axes[0], fig.legends[0]
    box, leg = ax.get_window_extent(), legend.get_window_extent()
    assert leg.x0 >= box.x1, (leg, box)  # right of the axes: no overlap with any curve
    assert leg.x1 <= fig.bbox.x1 + 1 and leg.y0 >= fig.bbox.y0 - 1  # and inside the figure, not cut off
    assert len(legend.get_texts()) == df["encoding"].nunique() + 1 + 1  # every group (peg's two) + training size


def test_the_committed_readme_figure_is_the_one_with_the_legend_outside():
    from PIL import Image

    with Image.open(readme_figure.figure_path()) as im:
        assert im.size == (round(8.4 * 110), round(4.2 * 110))  # plot_vs_size's own figure at update.py's dpi
    assert "results/compare/figures/digits_cell_today_vs_size.png" in (ROOT / "README.md").read_text()


def _means() -> pd.DataFrame:
    """Mean accuracy per (encoding and variant, size) of the finished runs, straight from the CSV."""
    df = pd.read_csv(CSV)
    df = df[df["status"] == "finished"]
    key = df["encoding"] + df["model.pe_kwargs.padding_mode"].fillna("").map(lambda v: f" [{v}]" if v else "") \
        if "model.pe_kwargs.padding_mode" in df else df["encoding"]
    return df.assign(key=key).pivot_table(index="key", columns="eval_size", values="acc", aggfunc="mean")


def caption_errors(caption: str) -> list[str]:
    """What ``caption`` says that the CSV, recomputed here, does not."""
    m, df = _means(), pd.read_csv(CSV)
    learned = m.loc["learned_abs", [s for s in m.columns if s > 32]]
    rope = m.loc[["rope_axial", "rope_mixed"], [48, 64]].to_numpy()
    held = [k for k in m.index if (m.loc[k] >= 0.95).all()]
    want = [f"keeps {learned.min():.2f}-{learned.max():.2f} above the training size",
            f"`none` stays near chance ({m.loc['none'].min():.2f}-{m.loc['none'].max():.2f}, chance 0.11)",
            f"fall to {rope.min():.2f}-{rope.max():.2f} from 48 px on",
            f"{len(held)} hold at every size ({', '.join(f'`{k}`' for k in held)}",
            f"{df['encoding'].nunique()} encodings trained at 32 px", "evaluated at 16-64 px",
            f"`{df['commit'].iloc[0][:7]}`"]
    errors = [w for w in want if w not in caption]
    if "hold only near the training size" in caption:  # the audit's finding: the learned table keeps 0.89-0.96
        errors.append("hold only near the training size")
    return errors


def test_the_readme_caption_is_written_from_the_csv_and_says_what_it_shows():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- BEGIN readme_caption -->\n(.*?)\n<!-- END readme_caption -->", text, re.S)
    assert block and block.group(1) == readme_figure.caption()
    assert caption_errors(block.group(1)) == []


def test_a_wrong_caption_figure_is_found():
    planted = readme_figure.caption().replace("0.89-0.96", "0.79-0.97")
    assert caption_errors(planted) == ["keeps 0.89-0.96 above the training size"]
