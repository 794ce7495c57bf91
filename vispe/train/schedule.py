"""The learning-rate schedule as a plan that survives a resume with another ``train.epochs``.

A fresh plan: linear warm-up over ``optim.warmup_epochs`` (factor (t + 1) / warmup at step t), then
a cosine from 1 to ``optim.min_lr / optim.lr`` at the last step (``optim.schedule="cosine"``),
1 throughout (``"constant"``), or 1 then 0.1 from epoch ``optim.lr_drop`` on (``"step"``, DETR).
The factor multiplies the learning rate of every parameter group; t counts optimiser steps from 0.

Resuming with another number of epochs re-plans the steps not yet taken, never those taken
(the constant and step schedules do not depend on the number of epochs: nothing changes):

* before the cosine has started (still warming up): the plan is the fresh plan of the new length,
  exactly what a run started with the new ``train.epochs`` would have followed;
* after that: a new segment from the current step to the new last step, a cosine from the factor
  reached down to the floor; the learning rate is continuous and ends at ``optim.min_lr``. After a
  finished run (the floor reached) the added epochs therefore train at ``optim.min_lr``; for a
  new warm-up and cosine, start a new run instead.

The segments are stored in the checkpoint (``Progress.schedule``), so later resumes follow the
same learning rates. A new length shorter than the steps already taken is refused.
"""
from __future__ import annotations

import math

import torch
from omegaconf import DictConfig


class LRPlan:
    """Learning-rate factor of every step, ``factor(t)``, made of segments (module docstring).

    ``segments``: ``[{"from_step": 0, "total_steps": T}]`` for a fresh plan, then one
    ``{"from_step": t0, "start_factor": f0, "total_steps": T'}`` per re-plan.
    """

    def __init__(self, cfg: DictConfig, steps_per_epoch: int, epochs: int, segments: list | None = None) -> None:
        o = cfg.optim
        self.warmup = int(round(o.warmup_epochs * steps_per_epoch))
        self.floor = o.min_lr / o.lr
        self.kind = o.schedule
        self.drop = int(round(o.lr_drop * steps_per_epoch)) if o.schedule == "step" else None
        self.segments = [dict(s) for s in segments] if segments else [{"from_step": 0, "total_steps": steps_per_epoch * epochs}]

    @property
    def total_steps(self) -> int:
        return self.segments[-1]["total_steps"]

    def factor(self, t: int) -> float:
        seg = next(s for s in reversed(self.segments) if s["from_step"] <= t)
        if "start_factor" in seg:  # a re-planned tail: cosine from start_factor to the floor
            return self._cosine(t - seg["from_step"], seg["total_steps"] - seg["from_step"], seg["start_factor"])
        warmup = min(self.warmup, seg["total_steps"])
        if t < warmup:
            return (t + 1) / warmup
        if self.kind == "step":
            return 0.1 if t >= self.drop else 1.0
        return self._cosine(t - warmup, seg["total_steps"] - warmup, 1.0)

    def _cosine(self, t: int, length: int, top: float) -> float:
        if self.kind != "cosine":
            return top
        p = min(t / max(length, 1), 1.0)
        return self.floor + (top - self.floor) * 0.5 * (1 + math.cos(math.pi * p))

    def replan(self, total_steps: int, step: int) -> str | None:
        """Re-plan the steps from ``step`` on for a run of ``total_steps``; a note saying how, or
        None when the length is unchanged. Raises ValueError for fewer steps than taken."""
        old = self.total_steps
        if total_steps == old:
            return None
        if total_steps < step:
            raise ValueError(f"train.epochs gives {total_steps} steps, but the run has already taken {step} "
                             f"steps: resume with at least as many epochs as done")
        warmup_left = step <= min(self.warmup, old) and len(self.segments) == 1
        if self.kind != "cosine":  # constant or step: the factors do not depend on the length
            self.segments[-1]["total_steps"] = total_steps
            how = f"the {self.kind} schedule does not depend on train.epochs and continues unchanged"
        elif warmup_left:
            self.segments = [{"from_step": 0, "total_steps": total_steps}]
            how = "still warming up: the schedule is the one a run of that length would follow"
        else:
            f0 = self.factor(step)
            self.segments.append({"from_step": step, "start_factor": f0, "total_steps": total_steps})
            how = (f"the steps taken keep their rates; steps {step}..{total_steps} follow a cosine from the "
                   f"factor reached, {f0:.4g} x optim.lr, down to optim.min_lr (a finished run stays at "
                   "min_lr); for a new warm-up and cosine, start a new run")
        return f"learning-rate schedule planned for {old} steps, now {total_steps} (at step {step}): {how}"


def build_scheduler(optimizer: torch.optim.Optimizer, plan: LRPlan) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR reading ``plan`` at every step (a re-plan after loading takes effect at once)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: plan.factor(t))  # a function: not in its state
