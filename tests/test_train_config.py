"""train.py's configuration: typed overrides, nearest-key hints, the configs/ files themselves."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vispe.train import config as C

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_defaults_and_overrides_take_effect():
    cfg = C.load_config(None, ["model.pe=rope_mixed", "train.epochs=100", "optim.lr=3e-4",
                               "train.eval_sizes=[1,2]", "model.pe_kwargs.base=50", "data.kwargs.k=4"])
    assert cfg.model.pe == "rope_mixed" and cfg.train.epochs == 100 and cfg.optim.lr == 3e-4
    assert list(cfg.train.eval_sizes) == [1.0, 2.0] and all(isinstance(s, float) for s in cfg.train.eval_sizes)
    assert cfg.model.pe_kwargs == {"base": 50} and cfg.data.kwargs == {"k": 4}
    assert cfg.train.run_name == "default"  # no file: the run is named "default"


@pytest.mark.parametrize("typo, nearest", [
    ("train.epoch=3", "train.epochs"),
    ("model.pee=none", "model.pe"),
    ("optim.weightdecay=0.1", "optim.weight_decay"),
    ("epochs=3", "train.epochs"),  # right key, missing section
    ("trian.epochs=3", "train.epochs"),  # misspelt section
])
def test_misspelt_key_names_the_nearest_valid_keys(typo, nearest):
    key = typo.split("=")[0]
    with pytest.raises(C.ConfigError, match=re.escape(f"unknown config key {key!r}")) as e:
        C.load_config(None, [typo])
    assert nearest in str(e.value).split("nearest valid keys:")[1]


@pytest.mark.parametrize("override, key, expected", [
    ("train.epochs=abc", "train.epochs", "int"),
    ("train.epochs=1.5", "train.epochs", "int"),
    ("optim.lr=fast", "optim.lr", "float"),
    ("train.compile=maybe", "train.compile", "bool"),
    ("train.eval_sizes=[1,x]", "train.eval_sizes", "List[float]"),
    ("train.eval_sizes=2", "train.eval_sizes", "List[float]"),
    ("data.batch_size=null", "data.batch_size", "int"),
    ("data.kwargs=5", "data.kwargs", "Dict[str, Any]"),
    ("model=3", "model", "a section of keys (model.*)"),
])
def test_wrong_type_names_key_value_and_expected_type(override, key, expected):
    with pytest.raises(C.ConfigError) as e:
        C.load_config(None, [override])
    msg = str(e.value)
    assert msg.startswith(f"config key {key}") and "command line" in msg and f"expected {expected}" in msg


@pytest.mark.parametrize("override, match", [
    ("train.device=gpu", r"train.device='gpu': expected one of 'auto', 'cpu', 'cuda'"),
    ("train.amp=fp8", r"train.amp='fp8': expected one of"),
    ("task.name=segmentation", r"task.name='segmentation': expected one of 'classification'"),
    ("data.batch_size=0", r"data.batch_size=0: expected a positive number"),
    ("train.eval_sizes=[]", r"train.eval_sizes=\[\]: expected a non-empty list"),
    ("train.run_name=a/b", r"train.run_name='a/b': expected a folder name"),
    ("train.epochs", r"override 'train.epochs' in command line: expected key=value"),
])
def test_bad_values_are_refused(override, match):
    with pytest.raises(C.ConfigError, match=match):
        C.load_config(None, [override])


def test_yaml_file_keys_are_checked_too(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("model:\n  pe: none\n  embed_dims: 64\n")
    with pytest.raises(C.ConfigError, match=r"unknown config key 'model.embed_dims' in .*bad.yaml.*model.embed_dim"):
        C.load_config(f)
    f.write_text("train:\n  epochs: many\n")
    with pytest.raises(C.ConfigError, match=r"config key train.epochs='many' in .*bad.yaml: expected int"):
        C.load_config(f)
    with pytest.raises(C.ConfigError, match="does not exist$"):  # nothing near it: no suggestion
        C.load_config(tmp_path / "missing.yaml")


def test_a_mistyped_config_path_gets_a_suggestion(tmp_path, monkeypatch):
    """issue 41, item 10: the nearest file names in the path's folder and in the repository's configs/."""
    (tmp_path / "exp_one.yaml").write_text("")
    with pytest.raises(C.ConfigError, match=r"does not exist; did you mean '.*exp_one.yaml'\?$"):
        C.load_config(tmp_path / "exp_on.yaml")
    monkeypatch.chdir(ROOT)
    for typo, want in (("configs/shape_detr.yaml", "'configs/shapes_detr.yaml'"),
                       ("confgs/digits_cell.yaml", "'configs/digits_cell.yaml'"),
                       ("configs/coco_detr.yml", "'configs/coco_detr.yaml'")):
        with pytest.raises(C.ConfigError, match="did you mean " + re.escape(want)):
            C.load_config(typo)


def test_precedence_file_then_smoke_then_command_line(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("train:\n  epochs: 7\n  seed: 3\nsmoke:\n  - train.epochs=1\n  - train.seed=4\n")
    assert C.load_config(f).train.epochs == 7 and C.load_config(f).train.run_name == "exp"
    smoke = C.load_config(f, smoke=True)
    assert (smoke.train.epochs, smoke.train.seed, smoke.train.run_name) == (1, 4, "exp_smoke")
    assert C.load_config(f, ["train.epochs=2"], smoke=True).train.epochs == 2
    f.write_text("smoke:\n  - train.epoks=1\n")
    with pytest.raises(C.ConfigError, match="unknown config key 'train.epoks' in the smoke list"):
        C.load_config(f, smoke=True)


def test_for_encoding_keeps_pe_kwargs_for_the_main_encoding_only():
    cfg = C.load_config(None, ["model.pe=rope_mixed", "model.pe_kwargs.base=50", "train.compare=[none,rope_mixed]"])
    assert C.encodings(cfg) == ["rope_mixed", "none"]
    main, base = C.for_encoding(cfg, "rope_mixed"), C.for_encoding(cfg, "none")
    assert main.model.pe_kwargs == {"base": 50} and base.model.pe_kwargs == {} and base.model.pe == "none"
    assert list(main.train.compare) == [] and cfg.model.pe == "rope_mixed"  # the original is untouched
    assert set(C.diff(cfg, base)) == {"model.pe", "model.pe_kwargs", "train.compare"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_config_file_loads_documents_itself_and_has_a_smoke_variant(path):
    cfg = C.load_config(path)
    smoke = C.load_config(path, smoke=True)
    assert smoke.train.run_name == f"{path.stem}_smoke" and smoke.train.epochs <= cfg.train.epochs
    header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
    assert f"python train.py --config configs/{path.name}" in header or path.stem == "default"
    assert re.search(r"[Ee]xpected", header) and re.search(r"[Rr]untime", header) and "--smoke" in header
    # resolving twice gives the same config (what the run folder stores reloads unchanged)
    again = OmegaConf.create(C.to_yaml(cfg))
    assert C.diff(cfg, OmegaConf.merge(OmegaConf.structured(C.Config), again)) == {}


def test_required_configs_exist():
    names = {p.stem for p in CONFIGS}
    assert {"default", "cifar10_vit", "digits_class", "digits_cell", "digits_relative",
            "digits_content_position"} <= names


def header_commands(path: Path) -> list[list[str]]:
    """The train.py commands of a config's header, as argument lists after ``train.py`` (a ``...``
    line continues the first command with its own overrides; backslash lines are joined)."""
    import shlex

    lines = [line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#   ")]
    joined, cur = [], ""
    for line in lines:
        cur += " " + line
        if not line.endswith("\\"):
            joined.append(cur.replace("\\", " ").split(" #")[0].strip())
            cur = ""
    out, first = [], None
    for cmd in joined:
        if not cmd.startswith(("python ", "torchrun ", "... ")):
            continue  # prose
        words = shlex.split(cmd)
        if "train.py" in words:
            args = words[words.index("train.py") + 1:]
            first = first or args
            out.append(args)
        elif words[:1] == ["..."]:
            out.append([*first, *words[1:]])
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_header_commands_that_train_different_things_use_different_run_folders(path):
    """issue 41, item 6: shapes_detr.yaml's variant commands wrote into the default run's folder (then
    refused: it holds a finished run). Commands with one run folder differ only in resumable keys."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_script_for_headers", ROOT / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    folders = {}
    for argv in header_commands(path):
        args = train.parse_args(argv)
        if args.resume:
            continue
        cfg = C.load_config(ROOT / args.config if args.config else train.DEFAULT_CONFIG, args.overrides, smoke=args.smoke)
        folders.setdefault(cfg.train.run_name, []).append((argv, cfg))
    assert folders, path
    for name, runs in folders.items():
        for argv, cfg in runs[1:]:
            differ = [k for k in C.diff(runs[0][1], cfg) if k not in C.RESUMABLE_KEYS]
            assert not differ, f"{path.name}: {argv} trains another model ({differ}) into runs/{name}"


def _header(config: str) -> str:
    """The comment lines at the top of ``configs/<config>.yaml``, as one line of single spaces."""
    lines = (ROOT / "configs" / f"{config}.yaml").read_text().splitlines()
    return " ".join(" ".join(line.lstrip("#").split()) for line in lines if line.startswith("#"))


def _flat(page: str) -> str:
    return " ".join((ROOT / page).read_text().split())


def test_documented_figures_of_config_runs_are_their_headers():
    """issue 41, item 3: the README (now docs/training.md) said the shapes config takes "about 7 minutes
    (AP 0.07 vs 0.02 ... after 24 epochs)" when its header said 16 epochs, 586 s and AP 0.512-0.553.
    Each figure the documentation gives for a config's run is checked against the config's header (and
    the config itself): the training page's sentence, every page's minutes for the shapes set, and the
    results page's rows of the embedded tasks and of the default run."""
    text = _flat("docs/training.md")
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
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:  # any other page's minutes for the shapes set (the guide's "about 7 minutes")
        for said in re.findall(r"shapes[^.]*?about (\d+) minutes", " ".join(page.read_text().split())):
            assert int(said) == round(seconds / 60), (page.name, said)
    text = _flat("docs/results.md")
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
