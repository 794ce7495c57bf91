"""The generic loop: one training epoch and one evaluation pass, for any task of ``tasks.TASKS``.

The task turns a batch into ``(loss, sums)``; this module does the rest: autocast, backward (with a
GradScaler for fp16), gradient clipping, the optimiser and scheduler steps, and the running sums,
which are reduced over processes at the end (``distributed.all_reduce_sums``). What happens after
each step (logging, checkpointing, stopping on Ctrl-C) is the caller's ``after_step`` callback;
``StopFlag`` turns Ctrl-C / SIGTERM into a request the caller honours after a complete step.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable

import torch

from vispe.train.checkpoint import Progress
from vispe.train.distributed import all_reduce_sums


class Interrupted(Exception):
    """Raised by ``after_step`` to stop after a complete step (Ctrl-C); the state is consistent."""


class StopFlag:
    """Set by SIGINT / SIGTERM; a second Ctrl-C stops at once (KeyboardInterrupt)."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach the main thread only: nothing to install
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        print(f"\n{signal.Signals(signum).name}: stopping after this step and saving a checkpoint "
              "(Ctrl-C again to stop at once)", flush=True)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def agreed(self, device) -> bool:
        """True on every rank when any rank was asked to stop (one all-reduce when distributed)."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return self.requested
        flag = torch.tensor(float(self.requested), device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device='cuda': no CUDA device is available (use train.device=auto or cpu)")
    return torch.device(name)


def resolve_amp(name: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 on CUDA for ``auto``, none on CPU; ``fp16`` only on CUDA."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    if name == "fp16" and device.type != "cuda":
        raise ValueError("train.amp='fp16' needs a CUDA device (use bf16 or none on CPU)")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}[name]


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def add_sums(total: dict, sums: dict) -> dict:
    for k, v in sums.items():
        total[k] = total[k] + v if k in total else v.clone()
    return total


#: key of the training sums counting the batches whose inputs hold NaN or inf (``nonfinite_inputs``)
NONFINITE_KEY = "nonfinite_inputs"


def nonfinite_inputs(batch) -> torch.Tensor:
    """1.0 when a floating tensor of ``batch`` (a tensor, or a tuple/list/dict of them, one level)
    holds NaN or inf, else 0.0, as a float64 tensor on that tensor's device; no host sync."""
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else [batch]
    flags = [~torch.isfinite(t).all() for t in items if torch.is_tensor(t) and t.is_floating_point()]
    if not flags:
        return torch.zeros((), dtype=torch.float64)
    bad = flags[0]
    for f in flags[1:]:
        bad = bad | f.to(bad.device)
    return bad.to(torch.float64)


def train_one_epoch(model, task, loader, *, optimizer, scheduler, scaler, device, amp_dtype,
                    grad_clip: float | None, progress: Progress, sums: dict,
                    after_step: Callable[[Progress, dict, torch.Tensor], None]) -> dict:
    """Train over ``loader`` (the rest of the epoch of ``progress``); returns the epoch's local sums.

    ``sums`` are the running sums of the batches already done in this epoch (a resumed epoch);
    ``sums[NONFINITE_KEY]`` counts the batches whose inputs held NaN or inf (checked by the caller).
    """
    model.train()
    for batch in loader:
        with autocast(device, amp_dtype):
            loss, batch_sums = task.step(model, batch, device, train=True)
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        scheduler.step()
        add_sums(sums, {**batch_sums, NONFINITE_KEY: nonfinite_inputs(batch).to(device)})
        progress.batch += 1
        progress.step += 1
        after_step(progress, sums, loss.detach())
    return sums


@torch.no_grad()
def evaluate(model, task, loader, *, device, amp_dtype, should_stop: Callable[[], bool] = lambda: False) -> dict:
    """Metrics of ``model`` on the whole data set (this process's shard, reduced over processes).

    A task whose metrics are not sums over samples (COCO mAP) defines its own ``evaluate`` with
    this signature, which is then used instead.
    """
    if hasattr(task, "evaluate"):
        return task.evaluate(model, loader, device=device, amp_dtype=amp_dtype, should_stop=should_stop)
    model.eval()
    sums: dict = {}
    for batch in loader:
        if should_stop():
            raise Interrupted
        with autocast(device, amp_dtype):
            _, batch_sums = task.step(model, batch, device, train=False)
        add_sums(sums, batch_sums)
    for k in task.sum_keys:  # an empty shard still takes part in the reduction
        sums.setdefault(k, torch.zeros((), dtype=torch.float64, device=device))
    sums = all_reduce_sums(sums)
    return task.metrics(sums)
