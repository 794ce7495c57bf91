#!/usr/bin/env python3
"""Set up the project's virtual environment on first use, then run Python in it.

    python3 bootstrap.py train.py            # the main job
    python3 bootstrap.py -m pytest -q        # the tests

Creates ``.venv/`` (git-ignored) with the tested versions of ``requirements.lock`` and vispe
installed in editable mode, and reinstalls only when ``requirements.lock`` or ``pyproject.toml``
change. Needs nothing but python3 (3.10 or newer) and access to the package index. After set-up
the command runs as if started directly (``launch``): on POSIX this process is replaced by the
environment's Python, so Ctrl-C stops the trainer cleanly (checkpoint saved) with no traceback.
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
STAMP = VENV / ".vispe-installed"


def _fingerprint() -> str:
    h = hashlib.sha256()
    for name in ("requirements.lock", "pyproject.toml"):
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()


def ensure_venv() -> None:
    want = _fingerprint()
    if PY.exists() and STAMP.exists() and STAMP.read_text() == want:
        return
    if not PY.exists():
        print(f"[bootstrap] creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("[bootstrap] installing requirements.lock (first run: a few minutes)", flush=True)
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["-r", str(ROOT / "requirements.lock")], check=True)
    subprocess.run(pip + ["--no-deps", "--no-build-isolation", "-e", str(ROOT)], check=True)
    subprocess.run([str(PY), "-c", "import timm, torchvision, vispe"], check=True)
    STAMP.write_text(want)


def launch(python: str, args: list[str], *, replace: bool = os.name != "nt") -> int:
    """Run ``python args`` so that it behaves exactly as if started directly.

    POSIX (``replace``): this process becomes it (``os.execv``): same process id, the terminal's
    Ctrl-C and a ``kill`` reach the trainer alone, which saves a checkpoint and exits 130.
    Windows has no real exec, so a child is started and this process ignores Ctrl-C while it
    waits (the console delivers Ctrl-C to the child too, which stops cleanly); the child's exit
    code is returned.
    """
    cmd = [python, *args]
    if replace:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(python, cmd)  # does not return
    child = subprocess.Popen(cmd)
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return child.wait()
    finally:
        signal.signal(signal.SIGINT, old)


def main() -> int:
    ensure_venv()
    args = sys.argv[1:] or ["-c", "import vispe; print('vispe', vispe.__version__)"]
    os.chdir(ROOT)
    return launch(str(PY), args)


if __name__ == "__main__":
    sys.exit(main())
