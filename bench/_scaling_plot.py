"""bench/scaling.py's figure: every encoding's step-time and peak-memory ratio to vispe ``none``
against the token count, beside timm's equivalents (read by ``python bench/scaling.py --plot F``)."""
from __future__ import annotations

from collections.abc import Callable


def plot(res: dict, encs: list[str], tokens: list[int], modes: list[str], path: str, title: str, *,
         family: Callable[[str], str], timm_names: dict[str, str], clock: str = "wall") -> None:
    """Ratios to vispe ``none`` against tokens (log-log), one panel per mode and kind (time, memory);
    vispe's lines styled by ``family(pe)``, timm's equivalents (``timm_names``) dotted."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(mode, kind) for kind in ("time", "memory") for mode in modes if res[kind].get(mode)]
    cols = min(2, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 5.0 * nrows), squeeze=False)
    styles = {"additive": "-", "rotary": "--", "bias": "-.", "conditional": ":"}
    cmap = plt.get_cmap("tab20")
    colour = lambda i: cmap((2 * i) % 20 + (2 * i) // 20)  # noqa: E731  (dark hues first, then light)
    for ax, (mode, kind) in zip(axes.flat, panels):
        data = res[kind][mode]
        key = clock if kind == "time" else "rss"
        for i, pe in enumerate(encs):
            for lib in ("vispe", "timm"):
                pts = [(n, data[str(n)][f"{lib} {pe}"][key]) for n in tokens
                       if f"{lib} {pe}" in data.get(str(n), {})]
                if not pts:
                    continue
                xs, ys = zip(*pts)
                if lib == "vispe":
                    ax.plot(xs, ys, styles.get(family(pe), "-"), marker="o", ms=3, color=colour(i), label=pe)
                else:
                    ax.plot(xs, ys, ":", marker="x", ms=4, color=colour(i), alpha=0.6, label=f"timm {timm_names[pe]}")
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")  # timm's dense biases reach 10-18x: a log axis keeps the lines near 1 apart
        lo, hi = ax.get_ylim()
        ticks = [t for t in (0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.5, 2, 3, 5, 10, 20) if lo <= t <= hi]
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(tokens, [str(n) for n in tokens])
        ax.set_xlabel("tokens (grid tokens, + 1 class token)")
        ax.set_ylabel(f"{f'step time ({clock})' if kind == 'time' else 'peak resident memory'} / vispe none (log)")
        ax.set_title(f"{mode}: {kind}")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
