"""The detector's bit-equality net (issue 46): a few smoke training steps of each design give exactly
the losses and final weights recorded in tests/data/detr_compat/smoke_digest.json (tools/detr_smoke_digest.py).
A refactor that only moves code must keep every bit; one that changes numbers must say so and rerecord."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "data" / "detr_compat" / "smoke_digest.json"


@pytest.mark.slow
def test_smoke_steps_equal_the_record_to_the_last_bit():
    # a fresh process: one thread, nothing cached by other tests
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "detr_smoke_digest.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    now, old = json.loads(out.stdout), json.loads(RECORD.read_text())
    assert sorted(now) == sorted(old) == sorted(["detr_dab_boxrpb", "detr_conditional", "deformable",
                                                 "deformable_two_stage", "deformable_dab", "dino"])
    for name in old:
        assert now[name] == old[name], name


def test_the_state_hash_sees_one_changed_bit():
    import torch

    sys.path.insert(0, str(ROOT / "tools"))
    from detr_smoke_digest import state_hash

    m = torch.nn.Linear(3, 2)
    h = state_hash(m)
    with torch.no_grad():
        m.weight.view(-1)[4] = torch.nextafter(m.weight.view(-1)[4], torch.tensor(2.0))
    assert state_hash(m) != h
