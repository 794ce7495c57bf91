"""``python3 bootstrap.py train.py`` behaves like ``python train.py`` (issue 19, item 1).

The terminal's Ctrl-C goes to the whole foreground process group. The launcher must not die on
it (a traceback) nor kill the trainer before it has saved its checkpoint. The tests start the
real ``bootstrap.py`` in a copy of the repository's top level whose ``.venv`` is a stub: a
``bin/python`` that runs the interpreter running these tests (which has every dependency) and
refuses ``-m pip``, and an install stamp that matches, so bootstrap installs nothing anywhere.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX signals and process groups")


def _load_bootstrap(path: Path):
    spec = importlib.util.spec_from_file_location(f"bootstrap_{abs(hash(str(path)))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _stub_checkout(tmp_path: Path) -> Path:
    """bootstrap.py, train.py, configs and a stub .venv that counts as installed."""
    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("bootstrap.py", "train.py", "requirements.lock", "pyproject.toml"):
        shutil.copy(ROOT / name, root / name)
    shutil.copytree(ROOT / "configs", root / "configs")
    bin_dir = root / ".venv" / ("Scripts" if os.name == "nt" else "bin")
    bin_dir.mkdir(parents=True)
    stub = bin_dir / "python"
    stub.write_text("#!/bin/sh\n"
                    'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "stub venv: no installs" >&2; exit 3; fi\n'
                    f'exec "{sys.executable}" "$@"\n')
    stub.chmod(0o755)
    boot = _load_bootstrap(root / "bootstrap.py")
    (root / ".venv" / ".vispe-installed").write_text(boot._fingerprint())
    return root


def _wait_for(predicate, proc, timeout=120.0):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"process ended (rc {proc.returncode}) before the condition:\n{out[-2000:]}\n{err[-2000:]}")
        time.sleep(0.02)
    proc.kill()
    pytest.fail("timed out")


def test_ctrl_c_through_bootstrap_saves_a_checkpoint_without_a_launcher_traceback(tmp_path):
    root = _stub_checkout(tmp_path)
    runs = tmp_path / "runs"
    args = [f"train.out_dir={runs}", "train.run_name=boot", "train.compare=[]", "train.progress=false",
            "train.epochs=30", "data.kwargs.n_train=64", "data.kwargs.n_test=8", "data.batch_size=8",
            "model.depth=1", "model.embed_dim=32", "model.num_heads=2", "train.eval_sizes=[1.0]"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("VISPE_TEST_SIGNAL_AT_STEP", None)
    out_file, err_file = tmp_path / "stdout", tmp_path / "stderr"
    with open(out_file, "w") as out, open(err_file, "w") as err:
        # a session of its own: the signal below goes to its process group, as a terminal's Ctrl-C does
        proc = subprocess.Popen(["python3" if shutil.which("python3") else sys.executable, "bootstrap.py",
                                 "train.py", *args], cwd=root, env=env, stdout=out, stderr=err,
                                start_new_session=True, text=True)
        try:
            # the end of epoch 1 is printed after its checkpoint: Ctrl-C lands in epoch 2
            _wait_for(lambda: "epoch 1/30" in out_file.read_text(), proc)
            os.killpg(proc.pid, signal.SIGINT)
            rc = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    stdout, stderr = out_file.read_text(), err_file.read_text()
    assert "[bootstrap] installing" not in stdout + stderr
    assert "Traceback" not in stderr, stderr[-3000:]
    assert rc == 130, f"rc {rc}\n{stderr[-3000:]}"
    assert "stopped: checkpoint saved" in stderr and "--resume" in stderr
    state = torch.load(runs / "boot" / "learned_abs" / "checkpoint.pt", weights_only=True)
    p = state["progress"]
    # saved on Ctrl-C after the step in progress: mid-epoch (batch >= 1), which only the Ctrl-C save
    # writes here (the periodic checkpoints are at the ends of epochs, batch 0); 8 steps per epoch
    assert p["epoch"] >= 1 and p["batch"] >= 1 and p["step"] == 8 * p["epoch"] + p["batch"], p


def test_windows_style_launch_ignores_ctrl_c_while_the_child_stops_cleanly(tmp_path):
    """``launch(replace=False)`` (the Windows path, run here on POSIX): the launcher survives
    Ctrl-C and returns the child's exit code; the child is not killed while it cleans up."""
    child = tmp_path / "child.py"
    marker = tmp_path / "saved"
    child.write_text(
        "import signal, sys, time\n"
        "stop = []\n"
        "signal.signal(signal.SIGINT, lambda *a: stop.append(1))\n"
        "print('ready', flush=True)\n"
        "while not stop:\n    time.sleep(0.01)\n"
        "time.sleep(1.0)  # a slow checkpoint: longer than subprocess's 0.25 s grace period\n"
        f"open({str(marker)!r}, 'w').write('ok')\n"
        "sys.exit(130)\n")
    launcher = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import bootstrap; "
                f"sys.exit(bootstrap.launch(sys.executable, [{str(child)!r}], replace=False))")
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in err, err
    assert proc.returncode == 130 and marker.read_text() == "ok"


def test_main_hands_the_arguments_to_launch_after_setup(tmp_path, monkeypatch):
    """``main`` runs the venv's Python on the arguments given, from the repository root."""
    root = _stub_checkout(tmp_path)
    boot = _load_bootstrap(root / "bootstrap.py")
    seen = {}
    monkeypatch.setattr(boot, "launch", lambda py, args: seen.update(py=py, args=args, cwd=os.getcwd()) or 7)
    monkeypatch.setattr(sys, "argv", ["bootstrap.py", "train.py", "--smoke"])
    monkeypatch.chdir(tmp_path)
    assert boot.main() == 7
    assert seen == {"py": str(root / ".venv" / "bin" / "python"), "args": ["train.py", "--smoke"], "cwd": str(root)}
