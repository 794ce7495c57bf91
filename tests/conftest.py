"""Shared helpers: build any registered encoding for a small model and run it through attention."""
from __future__ import annotations

import importlib.util
import os
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import vispe
from vispe.attention import Attention, PosContext
from vispe.registry import build_in

DIM, HEADS = 16, 2

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one thread per xdist worker: `-n 2` on 2 cores, no OpenMP threads spinning against each other
    torch.set_num_threads(1)


#: modules whose module fixture trains or builds something: with `-n 2` each runs as one unit, on one
#: worker, so that its fixture runs once (pytest-xdist's xdist_group mark would say the same, but
#: pytest-xdist 3.8 cannot tag the tests of pytest 9's node ids)
ONE_WORKER = ("test_sweep.py", "test_docs_site.py", "test_train_ddp.py", "test_train_detection.py", "test_wheel.py",
              "test_train_cifar.py", "test_train_resume.py")
#: Inductor's tests first: on a cold compile cache (a fresh machine) they are the longest by far
FIRST = ("test_train_compile.py", "test_compile.py")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: the CUDA tier (tests/test_gpu_*.py); skipped without a CUDA GPU, with one "
                                       "line saying why; `pytest -m gpu` runs it alone (docs/testing.md)")


GPU_TIER = "gpu tier:"  # how every skip reason of the CUDA tier starts (tests/gpu_cases.py)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """A test of the CUDA tier skipped for want of a GPU is reported at one place (tests/gpu_cases.py), so
    that `-rs` gives the whole tier one line."""
    rep = yield
    if rep.skipped and isinstance(rep.longrepr, tuple) and GPU_TIER in str(rep.longrepr[2]) \
            and item.get_closest_marker("gpu"):
        rep.longrepr = (str(Path(__file__).with_name("gpu_cases.py")), 1, rep.longrepr[2])
    return rep


def pytest_terminal_summary(terminalreporter):
    """One line for the CUDA tier when it was skipped, whatever `-r` asks."""
    reasons = [str(r.longrepr[2]) for r in terminalreporter.stats.get("skipped", [])
               if isinstance(r.longrepr, tuple) and GPU_TIER in str(r.longrepr[2])]
    if reasons:
        why = reasons[0].split(GPU_TIER, 1)[1].strip()
        terminalreporter.write_line(f"{GPU_TIER} {len(reasons)} tests skipped: {why}")


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`-n 2` (pytest-xdist's default distribution, load) hands the tests out one at a time, in the
    order below, as a worker frees up (xdist's own load sends each worker a quarter of the suite at
    once), and each module of ONE_WORKER as one unit. Another --dist is left to xdist."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneAtATime(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if Path(module).name in ONE_WORKER else nodeid

    config.option.loadscopereorder = False  # keep the collection order (not: largest unit first)
    return OneAtATime(config, log)


def pytest_collection_modifyitems(config, items):
    """Inductor's tests first, then the other tests marked slow and the modules of ONE_WORKER, then
    the rest, each in collection order: no long test starts last and leaves the other worker idle at
    the end of a `-n 2` run."""
    def rank(item) -> int:
        if item.path.name in FIRST:
            return FIRST.index(item.path.name)
        return 2 if item.get_closest_marker("slow") or item.path.name in ONE_WORKER else 3
    items.sort(key=rank)


def model_context(grid=(4, 4), num_prefix_tokens=0, dim=DIM, heads=HEADS) -> dict:
    """What a model tells every encoding it builds (each takes the names it needs)."""
    return dict(dim=dim, num_heads=heads, head_dim=dim // heads, grid=grid, num_prefix_tokens=num_prefix_tokens)


def build_for_test(name: str, **kw):
    torch.manual_seed(0)
    ctx = model_context(**{k: kw.pop(k) for k in list(kw) if k in ("grid", "num_prefix_tokens", "dim", "heads")})
    return build_in(name, ctx, **kw)


def attend(pe, x: torch.Tensor, shape, mask=None, num_prefix_tokens: int = 0) -> torch.Tensor:
    """Tokens (B, P+h*w, C) through one attention layer with encoding ``pe`` of any family."""
    fam = pe.family
    attn = Attention(x.shape[-1], HEADS, qkv_bias=True, pe=pe if fam in ("rotary", "bias") else None)
    P = num_prefix_tokens
    if fam == "additive":
        code = pe(shape, mask, device=x.device, dtype=x.dtype)  # (B|1, N, C)
        x = torch.cat([x[:, :P], x[:, P:] + code], dim=1)
    elif fam == "conditional":
        B, C = x.shape[0], x.shape[-1]
        g = x[:, P:].transpose(1, 2).reshape(B, C, *shape)
        g = g + pe(g, mask)
        x = torch.cat([x[:, :P], g.flatten(2).transpose(1, 2)], dim=1)
    return attn(x, ctx=PosContext(tuple(shape), P, mask))


def padded_bias_case(name: str, kw: dict, P: int = 1, shape=(3, 4), dim: int = 16, heads: int = 2):
    """A bias encoding ``name`` with every parameter moved off its initial value (prefix scalars and
    iRPE's tables start at zero), two images of ``P`` prefix and h*w tokens, and the context whose
    second image pads its last column.  -> (pe, x (2, P+h*w, dim), ctx)"""
    torch.manual_seed(0)
    h, w = shape
    pe = build_in(name, model_context(grid=(h, w), num_prefix_tokens=P, dim=dim, heads=heads), **kw)
    with torch.no_grad():
        for p in pe.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    mask = torch.zeros(2, h, w, dtype=torch.bool)
    mask[1, :, w - 1] = True
    return pe, torch.randn(2, P + h * w, dim), PosContext((h, w), P, mask)


#: the random state every test starts from; `VISPE_TEST_SEED=1 pytest` runs the suite on other draws,
#: to find a tolerance that only held for one draw
TEST_SEED = int(os.environ.get("VISPE_TEST_SEED", "0"))


def _seed_everything() -> None:
    torch.manual_seed(TEST_SEED)
    random.seed(TEST_SEED)
    np.random.seed(TEST_SEED)


@pytest.fixture(autouse=True, scope="module")
def _same_draws_in_every_module():
    """A module's own fixtures (a model built once for its tests) start from the seeded state too:
    autouse fixtures of a scope are set up before the other fixtures of that scope."""
    _seed_everything()


@pytest.fixture(autouse=True)
def _same_draws_in_every_test():
    """Every test starts from the same random state, whichever xdist worker runs it and whatever ran
    there before it: a test that draws without seeding gives the same numbers on every run and
    every machine, instead of failing once in a while on an unlucky draw."""
    _seed_everything()


@pytest.fixture(params=vispe.available())
def encoding_name(request):
    return request.param


def load_script(relpath: str, name: str | None = None):
    """A file of the repository that is not part of the package (train.py, results/compare/*.py,
    docs/hooks.py), loaded as a module."""
    path = Path(__file__).resolve().parents[1] / relpath
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_train_main():
    """``main`` of the repository's train.py (a script, not a module of the package)."""
    return load_script("train.py", "vispe_train_script").main


def load_compare_script(name: str):
    """``results/compare/<name>.py`` as a module (scripts beside the results, not part of the package)."""
    return load_script(f"results/compare/{name}.py", name)


def load_docs_hooks():
    """docs/hooks.py, the site's build hooks (its table and link functions import no mkdocs)."""
    return load_script("docs/hooks.py", "vispe_docs_hooks")


def md_block(md: Path, name: str) -> str | None:
    """The text of ``md`` between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` (the markers that
    results/compare/update.py and run_rope_scaling.py fill), or None when the block is missing."""
    m = re.search(rf"<!-- BEGIN {re.escape(name)} -->\n(.*?)\n<!-- END {re.escape(name)} -->", md.read_text(), re.S)
    return m.group(1) if m else None


def execute_notebook(path: Path, monkeypatch, last_cell: str):
    """Run notebook ``path`` at small scale (VISPE_NB_SMALL=1) in the interpreter running the tests,
    with ``last_cell`` appended; returns the executed notebook and its code-cell outputs, checked
    to hold no error."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("VISPE_NB_SMALL", "1")
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    nb.cells.append(nbformat.v4.new_code_cell(last_cell))
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return nb, outputs
