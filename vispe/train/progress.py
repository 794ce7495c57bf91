"""The progress of an epoch: tqdm's bar on a terminal, plain periodic lines in a log.

tqdm redraws its bar with carriage returns, many times a second: in a file (``python train.py >
run.log 2>&1``, a cluster job's log) every redraw stays, 130 KB for the default run. So the bar is
drawn only when its stream (stderr, tqdm's) is a terminal, or in a Jupyter notebook (tqdm's
widget); otherwise ``PlainProgress`` writes one
line every ``PLAIN_EVERY_S`` seconds to that stream, with the same numbers:

    [sine] epoch 3/16: 120/188 batches (64%), 41 s, loss=0.4312 lr=2.95e-04 img_s=187
"""
from __future__ import annotations

import sys
import time

#: seconds between two plain progress lines (an epoch shorter than this prints none: its summary line follows)
PLAIN_EVERY_S = 30.0


class PlainProgress:
    """tqdm's ``update`` / ``set_postfix`` / ``close`` as a line every ``every_s`` seconds."""

    def __init__(self, total: int, initial: int, desc: str, *, file, every_s: float) -> None:
        self.total, self.n, self.desc, self.file, self.every_s = total, initial, desc, file, every_s
        self.start = self.last = time.monotonic()
        self.postfix = ""

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every_s and self.n < self.total:
            self.last = now
            self.file.write(self.line(now) + "\n")
            self.file.flush()

    def set_postfix(self, **values) -> None:
        self.postfix = " ".join(f"{k}={v}" for k, v in values.items())

    def line(self, now: float) -> str:
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        return (f"{self.desc}: {self.n}/{self.total} batches{share}, {now - self.start:.0f} s"
                + (f", {self.postfix}" if self.postfix else ""))

    def close(self) -> None:
        """Nothing to clear: the epoch's summary line follows."""


def _in_notebook() -> bool:
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def progress_bar(enabled: bool, total: int, initial: int, desc: str, *, file=None):
    """A tqdm bar on a terminal, a ``PlainProgress`` elsewhere, or None when ``enabled`` is False."""
    if not enabled:
        return None
    file = sys.stderr if file is None else file
    isatty = getattr(file, "isatty", None)
    if not (isatty and isatty()) and not _in_notebook():
        return PlainProgress(total, initial, desc, file=file, every_s=PLAIN_EVERY_S)
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="batch", dynamic_ncols=True, leave=False, file=file)
