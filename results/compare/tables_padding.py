"""The padding-probe tables of results/compare (red-green task, Islam et al.'s Tables 1 and 4 beside
vispe's probes), filled into the Markdown blocks by ``update.py``; read from ``results/padding_leakage.csv``
and ``data/redgreen.csv`` / ``data/posenet_readout_zeros.csv``."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent


def redgreen_table() -> str:
    f = HERE / "data" / "redgreen.csv"
    if not f.is_file():
        return "(not run here)"
    df = pd.read_csv(f)
    paper = {"valid": "100.0 ± 0.0 / 0.2 ± 0.1", "same_zeros": "99.8 ± 0.1 / 8.4 ± 0.7",
             "same_circular": "73.7 ± 1.0 / 73.7 ± 1.0 (their code: circular padding of 2)",
             "full_zeros": "89.7 ± 0.5 / 89.7 ± 0.5", "full_circular": "(the row above, as their code runs it)"}
    lines = ["| convolution | similar (here) | dissimilar (here) | seeds | published similar / dissimilar |",
             "|---|---|---|---|---|"]
    for ct, g in df.groupby("conv_type", sort=False):
        lines.append(f"| {ct} | {g['similar_acc'].mean():.1f} ± {g['similar_acc'].std():.1f} | "
                     f"{g['dissimilar_acc'].mean():.1f} ± {g['dissimilar_acc'].std():.1f} | {len(g)} | {paper.get(ct, '-')} |")
    return "\n".join(lines)


# Islam et al. ICLR'20 (PUBLISHED.md section 1): Table 1 SPC/MAE on PASCAL-S, Black, White, Noise
ISLAM_T1 = {  # (target, model): [(spc, mae) for PASCAL-S, Black, White, Noise]
    ("H", "PosENet"): [(.012, .251), (.0, .251), (.0, .251), (.001, .251)],
    ("H", "VGG"): [(.742, .149), (.751, .164), (.873, .157), (.591, .173)],
    ("H", "ResNet"): [(.933, .084), (.987, .080), (.994, .078), (.973, .077)],
    ("V", "PosENet"): [(.131, .248), (.0, .251), (.0, .251), (.053, .250)],
    ("V", "VGG"): [(.816, .129), (.846, .146), (.927, .138), (.771, .150)],
    ("V", "ResNet"): [(.951, .083), (.978, .069), (.979, .072), (.968, .074)],
    ("G", "PosENet"): [(-.001, .233), (.0, .186), (.0, .186), (-.034, .214)],
    ("G", "VGG"): [(.814, .109), (.842, .123), (.898, .116), (.762, .129)],
    ("G", "ResNet"): [(.936, .070), (.953, .068), (.964, .064), (.971, .055)],
    ("HS", "PosENet"): [(-.001, .712), (-.055, .704), (.0, .704), (.023, .710)],
    ("HS", "VGG"): [(.405, .556), (.532, .583), (.576, .574), (.375, .573)],
    ("HS", "ResNet"): [(.534, .528), (.566, .518), (.562, .515), (.471, .530)],
    ("VS", "PosENet"): [(.006, .723), (.081, .709), (.081, .709), (.018, .714)],
    ("VS", "VGG"): [(.374, .567), (.538, .575), (.437, .578), (.526, .566)],
    ("VS", "ResNet"): [(.520, .537), (.574, .523), (.593, .514), (.523, .545)],
}
ISLAM_T4 = {  # PASCAL-S, (H, G, HS) x (spc, mae)
    "PosENet (padding=0)": [(.012, .251), (-.001, .233), (-.001, .712)],
    "PosENet with padding=1": [(.274, .239), (.205, .184), (.148, .608)],
    "PosENet with padding=2": [(.397, .223), (.380, .177), (.214, .595)],
    "VGG16 (padding=1, default)": [(.742, .149), (.814, .109), (.405, .556)],
    "VGG16 w/o padding": [(.381, .223), (.359, .174), (.011, .628)],
}
OURS = {"PosENet": ("vit", "none", "-"), "VGG": ("vgg", "-", "zeros"), "ResNet": ("resnet18", "-", "zeros")}


def _leakage() -> pd.DataFrame | None:
    f = HERE.parents[1] / "results" / "padding_leakage.csv"
    if not f.is_file():
        return None
    df = pd.read_csv(f)
    df["readout"] = df["probe_readout_padding"]
    extra = HERE / "data" / "posenet_readout_zeros.csv"
    if extra.is_file():
        e = pd.read_csv(extra)
        e["readout"] = e["probe_readout_padding"]
        df = pd.concat([df, e], ignore_index=True)
    df["backbone"] = df["backbone"].where(df["encoding"] == "-", "vit")
    return df


def _cell(df, backbone, encoding, padding, inp, target, readout="valid") -> tuple[float, float]:
    sel = df[(df["backbone"] == backbone) & (df["encoding"] == encoding) & (df["padding"] == padding)
             & (df["input"] == inp) & (df["target"] == target) & (df["readout"] == readout)]
    if backbone != "vit":
        sel = sel[sel["level"] == "all"]
    return (sel["spc"].mean(), sel["mae"].mean()) if len(sel) else (float("nan"), float("nan"))


def leakage_table1() -> str:
    df = _leakage()
    if df is None:
        return "(results/padding_leakage.csv missing)"
    head = ("| target | model (paper → here) | photos here | PASCAL-S paper | blank here | Black / White paper "
            "| noise here | Noise paper |")
    lines = [head, "|" + "---|" * 8]
    names = {"PosENet": "PosENet alone → ViT without position, valid read-out", "VGG": "VGG16 → small VGG, zeros",
             "ResNet": "ResNet152 → ResNet-18, zeros"}
    for (target, model), paper in ISLAM_T1.items():
        b, e, pad = OURS[model]
        here = [_cell(df, b, e, pad, inp, target) for inp in ("natural", "constant", "noise")]
        f = lambda v: f"{v[0]:.3f} / {v[1]:.3f}"  # noqa: E731
        lines.append(f"| {target} | {names[model]} | {f(here[0])} | {f(paper[0])} | {f(here[1])} | "
                     f"{paper[1][0]:.3f} / {paper[2][0]:.3f} (SPC) | {f(here[2])} | {f(paper[3])} |")
    return "\n".join(lines)


def leakage_table4() -> str:
    df = _leakage()
    if df is None:
        return "(results/padding_leakage.csv missing)"
    ours = {"PosENet (padding=0)": ("vit", "none", "-", "valid"),
            "PosENet with padding=1": ("vit", "none", "-", "zeros"),
            "PosENet with padding=2": None,
            "VGG16 (padding=1, default)": ("vgg", "-", "zeros", "valid"),
            "VGG16 w/o padding": ("vgg", "-", "valid", "valid")}
    here_names = {"PosENet (padding=0)": "ViT without position, valid 3x3 read-out",
                  "PosENet with padding=1": "ViT without position, zero-padded 3x3 read-out",
                  "PosENet with padding=2": "not run (the read-out is 3x3 with padding 0 or 1)",
                  "VGG16 (padding=1, default)": "small VGG, zero padding", "VGG16 w/o padding": "small VGG, valid convolutions"}
    lines = ["| paper row | here | H SPC / MAE here (paper) | G SPC / MAE here (paper) | HS SPC / MAE here (paper) |",
             "|---|---|---|---|---|"]
    for row, paper in ISLAM_T4.items():
        spec = ours[row]
        cells = []
        for (target, p) in zip(("H", "G", "HS"), paper):
            if spec is None:
                cells.append(f"- ({p[0]:.3f} / {p[1]:.3f})")
                continue
            b, e, pad, ro = spec
            v = _cell(df, b, e, pad, "natural", target, ro)
            cells.append("not run" if v[0] != v[0] else f"{v[0]:.3f} / {v[1]:.3f} ({p[0]:.3f} / {p[1]:.3f})")
        lines.append(f"| {row} | {here_names[row]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# results/padding_leakage.md's own tables (issue 53: no hand-typed figure): SPC and MAE averaged over the five
# targets per seed (the ViTs also over their four blocks), then mean ± std over the seeds.
INPUTS = ("natural", "constant", "noise")
TARGETS = ("H", "V", "G", "HS", "VS")


def _probe_rows() -> pd.DataFrame | None:
    f = HERE.parents[1] / "results" / "padding_leakage.csv"
    return pd.read_csv(f) if f.is_file() else None


def _seed_cells(g: pd.DataFrame) -> list[str]:
    """SPC then MAE, per input: mean ± std over the seeds of the per-seed mean over targets (and blocks)."""
    cells = []
    for col in ("spc", "mae"):
        for inp in INPUTS:
            s = g[g["input"] == inp].groupby("seed")[col].mean()
            cells.append(f"{s.mean():.2f} ± {s.std():.2f}")
    return cells


def leakage_cnn_table() -> str:
    df = _probe_rows()
    if df is None:
        return "(results/padding_leakage.csv missing)"
    lines = ["| backbone | padding | SPC natural | SPC constant | SPC noise | MAE natural | MAE constant | MAE noise |",
             "|---|---|---|---|---|---|---|---|"]
    cnn = df[(df["encoding"] == "-") & (df["level"] == "all")]
    for (backbone, padding), g in cnn.groupby(["backbone", "padding"], sort=False):
        lines.append(f"| {backbone} | {padding} | " + " | ".join(_seed_cells(g)) + " |")
    return "\n".join(lines)


def leakage_targets_table() -> str:
    df = _probe_rows()
    if df is None:
        return "(results/padding_leakage.csv missing)"
    lines = ["| backbone | padding | " + " | ".join(TARGETS) + " |", "|---|---|" + "---|" * len(TARGETS)]
    cnn = df[(df["encoding"] == "-") & (df["level"] == "all") & (df["input"] == "natural")]
    for (backbone, padding), g in cnn.groupby(["backbone", "padding"], sort=False):
        spc = g.groupby("target")["spc"].mean()
        lines.append(f"| {backbone} | {padding} | " + " | ".join(f"{spc[t]:.2f}" for t in TARGETS) + " |")
    return "\n".join(lines)


def leakage_vit_table() -> str:
    df = _probe_rows()
    if df is None:
        return "(results/padding_leakage.csv missing)"
    lines = ["| ViT encoding | SPC natural | SPC constant | SPC noise | MAE natural | MAE constant | MAE noise |",
             "|---|---|---|---|---|---|---|"]
    vit = df[df["encoding"] != "-"]
    for (encoding, padding), g in vit.groupby(["encoding", "padding"], sort=False):
        name = encoding if padding == "-" else f"{encoding}, {padding} padding"
        lines.append(f"| {name} | " + " | ".join(_seed_cells(g)) + " |")
    return "\n".join(lines)
