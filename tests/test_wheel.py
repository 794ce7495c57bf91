"""The package as a user installs it (issue 40): `python -m build` makes an sdist and a wheel (the
wheel built from the sdist, so the sdist is complete), and the wheel is installed with pip into a
fresh virtual environment outside the repository, where the README's example and
`python -m vispe` run.

What this proves: the wheel's files and metadata install with pip and work with nothing of the
repository (no path, no working directory, no editable install: ``vispe`` is imported from the
fresh environment); the dependencies it declares are satisfied by the locked set (`pip check`
there); every module of vispe/ and the ``py.typed`` marker are in it. What it does not: resolve
the dependencies from the package index. The fresh environment is made without them and sees the
project environment's packages (torch included, not downloaded again) through one path line, read
after its own site-packages; `pip install --no-deps` puts vispe there. The locked set itself is
what bootstrap.py installs from the index on a fresh machine.

`.ci/run` builds once (``VISPE_DIST``: the folder with the sdist and wheel); otherwise this test
builds into a temporary folder (``--no-isolation``: setuptools from the environment, no download).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

import vispe

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    given = os.environ.get("VISPE_DIST")
    if given:
        return Path(given)
    try:
        import build  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("python -m build is missing (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], check=True,
                   env=env, capture_output=True)
    return out


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"{folder}: expected one {pattern}, found {found}"
    return found[0]


def test_wheel_and_sdist_hold_what_a_user_needs(dist):
    wheel = _one(dist, f"vispe-{vispe.__version__}-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "vispe").rglob("*.py")}
    assert modules <= names, sorted(modules - names)  # no subpackage left out of the package list
    assert "vispe/py.typed" in names
    assert not [n for n in names if n.startswith(("tests/", "docs/", "configs/", "results/"))]
    meta = zipfile.ZipFile(wheel).read(f"vispe-{vispe.__version__}.dist-info/METADATA").decode()
    assert "License-Expression: MIT" in meta and f"Version: {vispe.__version__}" in meta
    assert "# vispe — 2D positional encodings" in meta  # the README as the long description
    sdist = _one(dist, f"vispe-{vispe.__version__}.tar.gz")
    top = f"vispe-{vispe.__version__}/"
    members = {m[len(top):] for m in tarfile.open(sdist).getnames()}
    for path in ("LICENSE", "CHANGELOG.md", "train.py", "configs/default.yaml", "mkdocs.yml", "docs/hooks.py",
                 "requirements.lock", "tests/test_wheel.py", "vispe/py.typed"):
        assert path in members, path


def test_wheel_installs_into_a_fresh_environment_and_runs_there(dist, tmp_path):
    wheel = _one(dist, "vispe-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                               capture_output=True, text=True).stdout.strip())
    (site / "zz_project_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    pip = [sys.executable, "-m", "pip", "--python", str(py), "--disable-pip-version-check"]
    subprocess.run(pip + ["install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, env=clean,
                   cwd=tmp_path)
    check = subprocess.run(pip + ["check"], env=clean, cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

    def run(*args):
        r = subprocess.run([str(py), *args], env=clean, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    example = re.search(r"^## Example\n\n```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    where = run("-c", example.group(1) + "\nassert logits.shape == (2, 10)\n"
                "import importlib.metadata as m; print(vispe.__file__, m.version('vispe'))").split()
    assert Path(where[0]).is_relative_to(site) and where[1] == vispe.__version__, where  # the wheel's vispe
    table = run("-m", "vispe")
    assert all(f"| {name} |" in table for name in vispe.available()), table
