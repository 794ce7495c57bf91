"""The learning-rate schedule and a resume with another ``train.epochs`` (issue 19, item 7).

The rule (``vispe.train.schedule``): the steps already taken keep their learning rates; if the
change comes before the cosine has started, the schedule is the one a fresh run with the new
length would have had; after that, the remaining steps follow a cosine from the learning rate
reached down to ``optim.min_lr`` at the new end (so a finished run continues at ``min_lr``).
"""
from __future__ import annotations

import math

import pytest

from vispe.train import config as C
from vispe.train.schedule import LRPlan


def _cfg(**optim):
    return C.load_config(None, [f"optim.{k}={v}" for k, v in optim.items()])


def _factors(plan, steps):
    return [plan.factor(t) for t in steps]


def test_fresh_plan_is_warmup_then_cosine_to_the_floor():
    cfg = _cfg(lr=1.0, min_lr=0.1, warmup_epochs=1)
    plan = LRPlan(cfg, steps_per_epoch=10, epochs=5)  # 50 steps, 10 of warm-up
    assert plan.total_steps == 50
    assert _factors(plan, range(10)) == pytest.approx([(t + 1) / 10 for t in range(10)])
    for t in range(10, 50):
        p = (t - 10) / 40
        assert plan.factor(t) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
    assert plan.factor(50) == pytest.approx(0.1)


def test_more_epochs_after_the_cosine_started_continue_from_the_lr_reached():
    cfg = _cfg(lr=1.0, min_lr=0.1, warmup_epochs=1)
    plan = LRPlan(cfg, steps_per_epoch=10, epochs=5)
    before = _factors(plan, range(31))
    note = plan.replan(total_steps=80, step=30)  # stopped at step 30 of 50, now 8 epochs
    assert "cosine" in note and "30" in note and "80" in note
    assert _factors(plan, range(31)) == before  # the steps taken keep their learning rates
    after = _factors(plan, range(30, 81))
    assert after[0] == pytest.approx(before[30])  # continuous
    assert all(a > b for a, b in zip(after, after[1:]))  # decreasing to the floor, no jump up
    assert after[-1] == pytest.approx(0.1)
    assert plan.factor(55) == pytest.approx(0.1 + (before[30] - 0.1) * 0.5 * (1 + math.cos(math.pi * 25 / 50)))


def test_more_epochs_after_a_finished_run_continue_at_min_lr():
    cfg = _cfg(lr=1.0, min_lr=0.1, warmup_epochs=1)
    plan = LRPlan(cfg, steps_per_epoch=10, epochs=5)
    plan.replan(total_steps=70, step=50)
    assert _factors(plan, range(50, 71)) == pytest.approx([0.1] * 21)
    plan.replan(total_steps=90, step=70)  # and again: the plan keeps every segment
    assert plan.factor(30) == pytest.approx(LRPlan(cfg, steps_per_epoch=10, epochs=5).factor(30))
    assert _factors(plan, range(70, 91)) == pytest.approx([0.1] * 21)
    again = LRPlan(cfg, steps_per_epoch=10, epochs=9, segments=plan.segments)  # as read from a checkpoint
    assert _factors(again, range(91)) == _factors(plan, range(91))


def test_a_change_during_warmup_gives_the_fresh_plan_of_the_new_length():
    cfg = _cfg(lr=1.0, min_lr=0.1, warmup_epochs=1)
    plan = LRPlan(cfg, steps_per_epoch=10, epochs=5)
    plan.replan(total_steps=80, step=7)
    fresh = LRPlan(cfg, steps_per_epoch=10, epochs=8)
    assert _factors(plan, range(81)) == _factors(fresh, range(81))


def test_constant_schedule_is_unchanged_and_the_same_length_needs_no_note():
    cfg = _cfg(lr=1.0, warmup_epochs=1, schedule="constant")
    plan = LRPlan(cfg, steps_per_epoch=10, epochs=5)
    assert plan.replan(total_steps=50, step=20) is None
    plan.replan(total_steps=80, step=30)
    assert _factors(plan, range(10, 81)) == [1.0] * 71


def test_step_schedule_matches_detr_and_does_not_depend_on_the_length():
    cfg = _cfg(lr=1.0, warmup_epochs=0, schedule="step", lr_drop=3)
    plan = LRPlan(cfg, steps_per_epoch=10, epochs=5)
    assert _factors(plan, range(50)) == [1.0] * 30 + [0.1] * 20
    plan.replan(total_steps=80, step=40)
    assert _factors(plan, range(80)) == [1.0] * 30 + [0.1] * 50


def test_fewer_steps_than_already_taken_are_refused():
    cfg = _cfg(lr=1.0, warmup_epochs=1)
    plan = LRPlan(cfg, steps_per_epoch=10, epochs=5)
    with pytest.raises(ValueError, match=r"train.epochs.*20 steps.*30 steps"):
        plan.replan(total_steps=20, step=30)
