"""Progress in a log file is plain lines, not tqdm's redrawn bar (issue 28, item 10).

tqdm redraws its bar with carriage returns many times a second; in a file each redraw stays (130 KB
for the default run). When the bar's stream is not a terminal, train.py writes a plain line every
``vispe.train.progress.PLAIN_EVERY_S`` seconds instead.
"""
from __future__ import annotations

import io

from conftest import load_train_main
from vispe.train import progress

TINY = ["data.kwargs.n_train=48", "data.kwargs.n_test=16", "data.batch_size=8", "model.embed_dim=32",
        "model.num_heads=2", "model.depth=1", "train.epochs=2", "train.eval_sizes=[1.0]", "train.compare=[]",
        "train.progress=true", "train.log_every=2"]


def test_a_run_logged_to_a_file_gets_plain_progress_lines(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)  # a line after every batch, to see them in a short run
    assert load_train_main()([f"train.out_dir={tmp_path}", *TINY]) == 0
    err = capsys.readouterr().err  # not a terminal
    assert "\r" not in err and "\x1b[" not in err  # no redrawn bar, no cursor moves
    lines = [line for line in err.splitlines() if " batches " in line]
    assert lines and lines[0].startswith("[learned_abs] epoch 1/2: 1/6 batches (17%), ")
    assert any("loss=" in line and "lr=" in line for line in lines)
    assert len(lines) == 2 * 5  # 6 batches an epoch: a line after each but the last (the epoch's line follows)


def test_a_terminal_still_gets_tqdm_s_bar_and_a_file_a_line_every_interval():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    bar = progress.progress_bar(True, 10, 0, "epoch 1/1", file=Terminal())
    assert type(bar).__module__.startswith("tqdm")
    bar.close()
    log = io.StringIO()
    plain = progress.progress_bar(True, 10, 0, "epoch 1/1", file=log)
    for _ in range(10):
        plain.update(1)  # well within PLAIN_EVERY_S: nothing written
    assert log.getvalue() == ""
    assert progress.progress_bar(False, 10, 0, "epoch 1/1", file=log) is None
