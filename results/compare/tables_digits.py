"""The digits pages' comparison tables, written from the committed CSVs by update.py.

``today_vs_old``: a task's rerun at today's code (data/<task>_today.csv) beside its old grid, in the seeds'
spread (rerun_today.md); ``relbias_init_table``: relbias on digits_relative under the two initialisations
(data/relbias_init_vit.csv, relbias_init_torch.csv).
"""
from __future__ import annotations

from vispe import report

from current import finished, load  # beside this file

INITS = (("relbias_init_vit", "ViT / timm default (`weight_init=''`: trunc-normal 0.02, zero biases)"),
         ("relbias_init_torch", "PyTorch default (`model.kwargs.weight_init=torch`: Kaiming-uniform, std ~0.07, non-zero biases)"))
CHANCE = {"digits_cell": 1 / 9, "digits_relative": 1 / 4, "digits_content_position": 1 / 20, "digits_class": 1 / 10}


def today_vs_old(task: str) -> str:
    """Test accuracy at the training size: the rerun at today's code (data/<task>_today.csv) beside the
    old grid, seed 0 of each beside the other (equal when the code path did not change), and the
    difference of means in the seeds' spread (the old grid's std with one seed today, else both
    pooled: reproducibility.md's unit)."""
    new, old = load(f"{task}_today"), load(task)
    if new is None or old is None:
        return "(not run here)"
    n = report.summarize(new)
    n = n[n["is_train_size"].astype(bool)].set_index("group")
    o = report.summarize(old)
    o = o[o["is_train_size"].astype(bool)].set_index("group")
    commits = lambda df: ", ".join(sorted({c[:7] for c in df["commit"].dropna()}))  # noqa: E731
    lines = [f"| encoding | today ({commits(new)}) | old grid ({commits(old)}) | seed 0: today / old | "
             "today - old, in seed stds |", "|---|---|---|---|---|"]
    ng, og = report.add_group(new), report.add_group(old)

    def cell(s, g):
        k = int(s.loc[g, "n"])
        return report.fmt(s.loc[g, "mean"], s.loc[g, "std"], k) + (f" ({k} seeds)" if k > 1 else "")

    def seed0(df, g):
        a = df[(df["group"] == g) & (df["seed"] == 0) & df["is_train_size"].astype(bool)]["acc"]
        return f"{a.iloc[0]:.3f}" if len(a) else "-"

    for g in n.sort_values("mean", ascending=False).index:
        today = cell(n, g)
        if g not in o.index:
            lines.append(f"| {g} | {today} | - | {seed0(ng, g)} / - | - |")
            continue
        d = n.loc[g, "mean"] - o.loc[g, "mean"]
        stds = [o.loc[g, "std"]] + ([n.loc[g, "std"]] if n.loc[g, "n"] > 1 else [])
        unit = (sum(x * x for x in stds) / len(stds)) ** 0.5
        z = f" ({d / unit:+.1f})" if unit > 0 else ""
        lines.append(f"| {g} | {today} | {cell(o, g)} | "
                     f"{seed0(ng, g)} / {seed0(og, g)} | {d:+.3f}{z} |")
    return "\n".join(lines)


def relbias_init_table() -> str:
    """relbias on digits_relative under the two initialisations: per seed and mean, at the training size."""
    lines = ["| initialisation | seed 0 | seed 1 | seed 2 | mean ± std | seeds above chance + 0.05 | commit |",
             "|---|---|---|---|---|---|---|"]
    for name, label in INITS:
        df = load(name)
        fin = finished(df)
        if fin is None:
            lines.append(f"| {label} | not run | | | | | |")
            continue
        at = fin.set_index("run")["acc"]
        seeds = [at.get(f"relbias_seed{i}", float("nan")) for i in range(3)]
        got = at.dropna()
        above = int((got > CHANCE["digits_relative"] + 0.05).sum())
        commit = ", ".join(sorted({c[:7] for c in df["commit"].dropna()}))
        lines.append(f"| {label} | " + " | ".join("-" if v != v else f"{v:.3f}" for v in seeds)
                     + f" | {report.fmt(got.mean(), got.std(), len(got))} | {above} of {len(got)} | {commit} |")
    return "\n".join(lines)
