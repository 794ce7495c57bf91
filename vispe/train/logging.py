"""What a run leaves behind: metrics.csv, TensorBoard events, curves.png, summary.json.

The history of per-epoch metrics lives in the checkpoint (``Progress.history``); ``metrics.csv``
and ``curves.png`` are rewritten from it (atomically) after each epoch, so a run that is killed and
resumed has exactly one row per epoch. TensorBoard uses the optimiser step as x axis for every
tag; the runner flushes the events of a step before it writes that step's checkpoint, and on
resume purges the events of later steps (``purge_step`` = checkpoint step + 1), so the scalars read
back equal an uninterrupted run's, step for step (tests/test_train_resume.py).

TensorBoard reads the event files of a folder in name order, and replays the purge in that order:
a resumed run's file must sort after the stopped run's. The name starts with the creation second,
then host, process id and a per-process counter (as text: "10" sorts before "9"), so a writer
created in the same second as the previous one (a resume in the same process, as in the tests) or
on a machine whose clock is behind would sort first: the scalars then read back out of order and
the stopped run's orphaned events are not purged. ``RunLog`` therefore waits, when the folder
already holds events, until the clock has passed the newest file's second (a second at most in
the same process; a clock more than ``CLOCK_WAIT_S`` behind gets a warning instead).
Only rank 0 logs (``enabled=False`` elsewhere).
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import time
import warnings
from pathlib import Path

#: the longest RunLog waits for the clock to pass the newest event file's second (see above)
CLOCK_WAIT_S = 5.0


class WriteError(Exception):
    """A file of the run could not be written (full disk, read-only folder); says which and why."""


def os_error_in(err: BaseException | None) -> OSError | None:
    """The OSError behind ``err`` (itself, or in its chain: torch wraps a failed write)."""
    while err is not None:
        if isinstance(err, OSError):
            return err
        err = err.__cause__ or err.__context__
    return None


def write_error(path: str | Path, err: BaseException) -> WriteError:
    """A WriteError naming ``path`` (hence its folder) and the system's reason."""
    cause = os_error_in(err) or err
    why = f"{cause.strerror} [Errno {cause.errno}]" if isinstance(cause, OSError) and cause.strerror else str(cause)
    return WriteError(f"cannot write {path}: {why}. Files already written there are kept; free some space "
                      "or make the folder writable, then run again (--resume continues from the last checkpoint)")


def remove_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def write_atomically(path: str | Path, write) -> None:
    """Call ``write(f)`` on ``<path>.tmp``, flush it to disk and rename it over ``path``.

    On any failure the temporary file is removed and ``path`` is left as it was; a failure caused
    by the system (full disk, no permission) becomes a WriteError naming the file.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        remove_quietly(tmp)
        if isinstance(e, Exception) and os_error_in(e) is not None:
            raise write_error(path, e) from e
        raise


def atomic_write(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (``write_atomically``)."""
    write_atomically(path, lambda f: f.write(data.encode() if isinstance(data, str) else data))


def newest_event_second(folder: Path) -> int | None:
    """The creation second in the name of the newest TensorBoard event file in ``folder``, or None."""
    seconds = []
    for f in folder.glob("*tfevents*"):
        part = f.name.split("tfevents.", 1)[-1].split(".", 1)[0]
        if part.isdigit():
            seconds.append(int(part))
    return max(seconds, default=None)


def wait_to_sort_last(folder: Path, *, max_wait_s: float = CLOCK_WAIT_S) -> None:
    """Return once an event file created now sorts after every one in ``folder`` (module doc)."""
    newest = newest_event_second(folder)
    if newest is None:
        return
    wait = newest + 1 - time.time() + 0.01  # (a hundredth of a second past the boundary)
    if wait > max_wait_s:
        warnings.warn(f"{folder}: the newest TensorBoard event file was created at {newest} s, {wait:.0f} s "
                      "ahead of this machine's clock; TensorBoard may read this run's events before the earlier "
                      "ones (out of order, orphaned steps not purged). Check the clock", stacklevel=3)
    elif wait > 0:
        time.sleep(wait)


class RunLog:
    """CSV + TensorBoard + plot + summary of one encoding's run folder."""

    def __init__(self, run_dir: str | Path, *, enabled: bool = True, purge_step: int | None = None):
        self.dir, self.enabled, self._tb = Path(run_dir), enabled, None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            try:
                if (self.dir / "tb").is_dir():
                    wait_to_sort_last(self.dir / "tb")
                self._tb = SummaryWriter(str(self.dir / "tb"), purge_step=purge_step)
            except OSError as e:
                raise write_error(self.dir / "tb", e) from e

    def scalars(self, step: int, values: dict, prefix: str) -> None:
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(f"{prefix}/{k}", v, step)

    def flush(self) -> None:
        """Write the queued TensorBoard events to disk."""
        if self._tb is not None:
            try:
                self._tb.flush()
            except OSError as e:
                raise write_error(self.dir / "tb", e) from e

    def epoch(self, history: list[dict]) -> None:
        """Log the last epoch of ``history`` and rewrite metrics.csv and curves.png."""
        if not self.enabled:
            return
        row = history[-1]
        self.scalars(row["step"], {k: v for k, v in row.items() if k not in ("epoch", "step")}, "epoch")
        self.flush()
        self.files(history)

    def files(self, history: list[dict]) -> None:
        """Rewrite metrics.csv and curves.png from ``history`` (atomically)."""
        if not self.enabled or not history:
            return
        buf = io.StringIO()
        fields = list(dict.fromkeys(k for row in history for k in row))  # test_* only on evaluated epochs
        writer = csv.DictWriter(buf, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(history)
        atomic_write(self.dir / "metrics.csv", buf.getvalue())
        plot_curves(history, self.dir / "curves.png", title=self.dir.name)

    def summary(self, summary: dict) -> None:
        if self.enabled:
            atomic_write(self.dir / "summary.json", json.dumps(summary, indent=2) + "\n")

    def close(self) -> None:
        if self._tb is not None:
            tb, self._tb = self._tb, None
            try:
                tb.close()
            except OSError:  # a full disk: the error that stopped the run is the one to report
                pass


#: most panels in a row of curves.png (a detector's ten metrics: a 4 x 3 grid, not a 4,500 px strip)
CURVE_COLS = 4


def plot_curves(history: list[dict], path: str | Path, title: str = "") -> None:
    """Loss and every other metric against the epoch, train and test, in one PNG: a grid of panels,
    at most ``CURVE_COLS`` a row, the loss and its terms first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({k.split("_", 1)[1] for r in history for k in r if k.startswith(("train_", "test_"))},
                   key=lambda n: (not n.startswith("loss"), n != "loss", n))  # loss, its terms, then the rest
    cols = max(1, min(len(names), CURVE_COLS, max(2, math.ceil(math.sqrt(len(names))))))  # 10 metrics: 4 x 3
    rows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.1 * rows + 0.3), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        for split in ("train", "test"):
            key = f"{split}_{name}"
            rows = [r for r in history if key in r]  # test metrics exist on evaluated epochs only
            if rows:
                ax.plot([r["epoch"] for r in rows], [r[key] for r in rows], marker="o", ms=3, label=split)
        ax.set_xlabel("epoch")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def plot_comparison(results: dict[str, list[dict]], path: str | Path, metric: str = "test_acc") -> None:
    """``metric`` against the epoch for each encoding ``{pe: history}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for pe, history in results.items():
        rows = [r for r in history if metric in r]
        if rows:
            ax.plot([r["epoch"] for r in rows], [r[metric] for r in rows], marker="o", ms=3, label=pe)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def comparison_table(summaries: dict[str, dict], metric: str) -> str:
    """A Markdown table: one row per encoding, the final ``metric`` at each evaluation size."""
    sizes = sorted({int(s) for summ in summaries.values() for s in summ["eval"]})
    head = ["encoding", "params"] + [f"test {metric} @{s}px" for s in sizes] + ["train time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for pe, summ in summaries.items():
        cells = [summ.get("label", pe), f"{summ['params'] / 1e6:.3f}M"]  # a detector's label names its design
        cells += [f"{summ['eval'][str(s)][metric]:.4f}" if str(s) in summ["eval"] else "-" for s in sizes]
        cells.append(f"{summ['train_time_s']:.0f}s")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
