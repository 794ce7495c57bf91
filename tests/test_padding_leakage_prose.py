"""results/padding_leakage.md's figures in prose ("What the numbers say") are what results/padding_leakage.csv gives:
each sentence recomputed here from the CSV the way the page's tables are (per input: mean over targets, and over
blocks for the ViTs, per seed; then the mean over the seeds), at the page's two digits."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "results" / "padding_leakage.md"
CSV = ROOT / "results" / "padding_leakage.csv"
BACKBONES = ("vgg", "resnet18")


def _df() -> pd.DataFrame:
    return pd.read_csv(CSV)


def _spc(rows: pd.DataFrame, inp: str) -> float:
    """The tables' cell: the seeds' mean of each seed's mean SPC over targets (and blocks) on input ``inp``."""
    return rows[rows["input"] == inp].groupby("seed")["spc"].mean().mean()


def _cnn(df: pd.DataFrame, backbone: str, padding: str) -> pd.DataFrame:
    return df[(df["encoding"] == "-") & (df["level"] == "all") & (df["backbone"] == backbone) & (df["padding"] == padding)]


def _vit(df: pd.DataFrame, encoding: str, padding: str = "-") -> pd.DataFrame:
    return df[(df["encoding"] == encoding) & (df["padding"] == padding)]


def _f(x: float) -> str:
    s = f"{x:.2f}"
    return "0.00" if s == "-0.00" else s


def _span(values) -> str:
    lo, hi = _f(min(values)), _f(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def _zeros(df):
    blank = [_spc(_cnn(df, b, "zeros"), i) for b in BACKBONES for i in ("constant", "noise")]
    return (f"every target on blank images and noise (SPC {_span(blank)}) and on photos "
            f"({_f(_spc(_cnn(df, 'vgg', 'zeros'), 'natural'))} VGG, {_f(_spc(_cnn(df, 'resnet18', 'zeros'), 'natural'))} "
            "ResNet-18)")


def _noise(df):
    mirrored = [_spc(_cnn(df, b, p), "noise") for b in BACKBONES for p in ("reflect", "replicate")]
    circular = [_spc(_cnn(df, b, "circular"), "noise") for b in BACKBONES]
    valid = [_spc(_cnn(df, b, "valid"), "noise") for b in BACKBONES]
    return (f"on noise SPC {_span(mirrored)}. Mirrored or repeated border pixels are a local pattern that a convolution "
            f"can detect. Circular padding ({_span(circular)}) and valid convolutions ({_span(valid)}) leak nothing "
            "measurable on noise")


def _floor(df):
    vit = [_spc(_vit(df, "none"), "natural"), _spc(_vit(df, "peg", "circular"), "natural")]
    valid = [_spc(_cnn(df, b, "valid"), "natural") for b in BACKBONES]
    rrc = [_spc(_cnn(df, b, p), "natural") for b in BACKBONES for p in ("reflect", "replicate", "circular")]
    return (f"(ViT without encoding or with circular PEG {_span(vit)}, valid CNNs {_span(valid)})",
            f"reflect, replicate and circular on photos ({_span(rrc)})")


def _vits(df):
    blank = [_spc(_vit(df, e), "constant") for e in ("none", "rope_axial")]
    noise = [_spc(_vit(df, e), "noise") for e in ("none", "rope_axial")]
    sine = [_spc(_vit(df, "sine"), i) for i in ("constant", "noise")]
    peg = [_spc(_vit(df, "peg", "zeros"), i) for i in ("constant", "noise")]
    assert _span(blank) == "0.00", blank  # the page says 0
    return (f"(0 on blank images, {_span(noise)} on noise); the sine encoding carries it at every block "
            f"({_span(sine)}); PEG reads it from its zero padding ({_span(peg)})")


def _blocks(df):
    vit = df[df["encoding"] != "-"]
    per_block = vit.groupby(["encoding", "padding", "input", "level"])["spc"].mean()
    spread = per_block.groupby(["encoding", "padding", "input"]).agg(lambda s: s.max() - s.min())
    return f"the blocks differ by at most {_f(spread.max())}"


SAID = {"zero padding": _zeros, "noise": _noise, "floor": _floor, "vits": _vits, "blocks": _blocks}


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("name", sorted(SAID))
def test_the_pages_figures_are_what_the_csv_gives(name):
    said = SAID[name](_df())
    page = _flat(PAGE.read_text())
    for sentence in (said if isinstance(said, tuple) else (said,)):
        assert _flat(sentence) in page, f"results/padding_leakage.md should say: {sentence}"


def test_a_changed_row_changes_the_sentence():
    """The check can fail: the sine ViT's SPC on noise lowered by 0.1 changes what the page must say."""
    df = _df()
    before = _vits(df)
    df.loc[(df["encoding"] == "sine") & (df["input"] == "noise"), "spc"] -= 0.1
    assert _vits(df) != before and _flat(_vits(df)) not in _flat(PAGE.read_text())
