"""The README's code blocks run as written (issue 19, item 9).

Every ```python block is executed, in order, each in a fresh namespace. A block that cannot run in
the suite (it needs a download or a GPU) must start with the visible marker ``# not run by the
tests: <why>``; it is still compiled. The ```bash blocks are commands: every ``train.py`` command
is parsed and its config loaded and checked as ``train.py`` does before training (keys, types,
values, encoding names; training itself is covered by the train tests), and every file a command
names must exist.
"""
from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import torch

import vispe.registry
from vispe.train import config as C

ROOT = Path(__file__).resolve().parents[1]
MARKER = "# not run by the tests:"


def blocks(lang: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def test_the_readme_has_python_and_bash_blocks():
    assert len(blocks("python")) >= 1 and len(blocks("bash")) >= 2


@pytest.mark.parametrize("i", range(len(blocks("python"))))
def test_python_block_runs_as_written(i, monkeypatch, tmp_path):
    src = blocks("python")[i]
    code = compile(src, f"README.md python block {i + 1}", "exec")
    if src.startswith(MARKER):
        reason = src.splitlines()[0][len(MARKER):].strip()
        assert reason, "say why the block cannot run"
        pytest.skip(f"README block {i + 1}: {reason}")
    monkeypatch.chdir(tmp_path)  # anything it writes goes there
    torch.manual_seed(0)
    exec(code, {"__name__": f"readme_block_{i + 1}"})


def _commands():
    for block in blocks("bash"):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                yield line


@pytest.mark.parametrize("line", list(_commands()))
def test_bash_command_names_existing_files_and_a_valid_train_config(line):
    words = shlex.split(line)
    for w in words:
        if re.fullmatch(r"[\w./-]+\.(py|yaml)", w) and "=" not in w:
            assert (ROOT / w).is_file(), f"{line!r}: {w} does not exist"
    if "train.py" not in words:
        return
    spec = importlib.util.spec_from_file_location("train_script_for_readme", ROOT / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    args = train.parse_args(words[words.index("train.py") + 1:])
    if args.config and "<run_name>" in args.config:  # a run's stored config (written by the run)
        assert args.config == "runs/<run_name>/config.yaml" and args.resume
        return
    cfg = C.load_config(ROOT / args.config if args.config else train.DEFAULT_CONFIG, args.overrides, smoke=args.smoke)
    for pe in C.encodings(cfg):
        vispe.registry.get(pe)  # an unknown encoding name is a ValueError


def test_commands_after_the_quickstart_use_one_python_stated_once():
    """One way to run things (issue 28, item 8): the Quickstart runs bootstrap.py; every later
    command says `python`, the environment's, which the README says how to get once; train.py's
    resume hint is the README's command."""
    text = (ROOT / "README.md").read_text()
    after = text.split("## Use", 1)[1]
    assert "python3 bootstrap.py train.py" not in after and "python3 bootstrap.py bench" not in after
    assert text.count("source .venv/bin/activate") == 1
    lines = [line for block in re.findall(r"^```bash\n(.*?)^```", after, flags=re.S | re.M)
             for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert lines and all(line.startswith(("python ", "torchrun ")) for line in lines), lines
    spec = importlib.util.spec_from_file_location("train_script_hint", ROOT / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    assert train.RESUME_HINT.format(config="runs/<run_name>/config.yaml") in text


def _header(config: str) -> str:
    """The comment lines at the top of ``configs/<config>.yaml``, as one line of single spaces."""
    lines = (ROOT / "configs" / f"{config}.yaml").read_text().splitlines()
    return " ".join(" ".join(line.lstrip("#").split()) for line in lines if line.startswith("#"))


def _flat_readme() -> str:
    return " ".join((ROOT / "README.md").read_text().split())


def test_readme_figures_of_config_runs_are_their_headers():
    """issue 41, item 3: the README said the shapes config takes "about 7 minutes (AP 0.07 vs 0.02 ...
    after 24 epochs)" when its header said 16 epochs, 586 s and AP 0.512-0.553. Each figure the README
    gives for a config's run is checked against the config's header (and the config itself)."""
    text = _flat_readme()
    # the shapes config: minutes, seconds, AP and epochs as its header states them
    (sentence,) = [s for s in re.split(r"(?<=\.) (?=[A-Z])", text) if "the shapes config" in s]
    head = _header("shapes_detr")
    seconds = int(re.search(r"Expected runtime: (\d+) s wall", head).group(1))
    ap, std, seeds = re.search(r"([\d.]+) \+- ([\d.]+) / [\d.]+ \+- [\d.]+ after \d+ epochs", head).group(1, 2) + \
        re.search(r"measured, (\d+) seeds", head).groups()
    epochs = C.load_config(ROOT / "configs" / "shapes_detr.yaml").train.epochs
    assert f"after {epochs} epochs" in head
    assert int(re.search(r"about (\d+) minutes", sentence).group(1)) == round(seconds / 60), sentence
    assert f"{seconds} s" in sentence and f"AP {ap} ± {std}" in sentence, sentence
    assert re.findall(r"(\d+) epochs", sentence) == [str(epochs)] and f"{seeds} seeds" in sentence, sentence
    command = re.search(r"`(time )?(python train\.py [^`]+)`", head).group(2)
    assert f"`{command}`" in sentence  # the command the figure comes from
    # the Results table's row of the embedded tasks: each example is its config's header at the training size
    (row,) = [c for c in text.split("| ") if c.startswith("the four embedded tasks,")]
    task, pairs = re.search(r"`(digits_\w+)`: ((?:\w+ [\d.]+(?:, )?)+)", row).groups()
    head = _header(task)
    sizes = [int(s) for s in re.search(r"test accuracy at ([\d / ]+) px", head).group(1).split(" / ")]
    from vispe.data import dataset_info

    cfg = C.load_config(ROOT / "configs" / f"{task}.yaml")
    col = sizes.index(cfg.data.img_size or dataset_info(cfg.data.name, **cfg.data.kwargs).img_size)  # training size
    for name, value in re.findall(r"(\w+) ([\d.]+)", pairs):
        got = float(re.search(rf" {name} ((?:[\d.]+ / )+[\d.]+)", head).group(1).split(" / ")[col])
        assert round(got, len(value.split(".")[1])) == float(value), (task, name, value, got)
    # the default run's row: its ranges, as the default config's header and results/default_run.md give them
    (row,) = [c for c in text.split("| ") if c.startswith("default run: `learned_abs`")]
    ranges = re.findall(r"\d\.\d+-\d\.\d+", row)
    assert len(ranges) == 2
    for r in ranges:
        assert r in _header("default") and r in (ROOT / "results" / "default_run.md").read_text(), r
