"""Train and evaluate one encoding: build, (resume), loop over epochs, evaluate at every size.

``build_data`` is shared by the encodings of one invocation (same data, same order);
``run_encoding`` does one encoding's run in its own folder and returns its summary. Checkpoints
are written at the end of every epoch, every ``train.ckpt_every_steps`` steps, and on Ctrl-C /
SIGTERM (after the step in progress, so the state is consistent); the checkpoint holds the data
position inside the epoch, so a resumed run continues exactly where it stopped.
"""
from __future__ import annotations

import math
import os
import platform
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from vispe.train import checkpoint as ckpt, distributed as D, engine, loaders
from vispe.train.logging import RunLog
from vispe.train.progress import progress_bar
from vispe.train.schedule import LRPlan, build_scheduler
from vispe.train.threads import apply_threads

#: test hook "<step>:<KILL|INT|TERM>": the process sends itself that signal after optimiser step
#: <step> (tests of resume after SIGKILL and after Ctrl-C); unset in normal use
SIGNAL_ENV = "VISPE_TEST_SIGNAL_AT_STEP"


class SetupError(ValueError):
    """The data or the model named by the config could not be built; the message says why."""


@dataclass
class Data:
    info: object
    img_size: int  # training size
    train: loaders.SeededSamples
    test: torch.utils.data.Dataset
    eval_sets: dict = field(default_factory=dict)  # {size: (scale, test set at that size)}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_data(task, cfg: DictConfig) -> Data:
    """The data sets named by ``cfg.data``; any failure becomes a SetupError naming the data set."""
    d = cfg.data
    try:
        info = task.info(cfg)
        train = task.dataset(cfg, "train", d.img_size)
        test = task.dataset(cfg, "test", d.img_size)
    except Exception as e:  # missing folder, corrupt file, unknown name, bad kwargs...
        raise SetupError(f"data.name={d.name!r} (data.root={d.root!r}) could not be loaded: "
                         f"{type(e).__name__}: {e}") from e
    train = loaders.SeededSamples(loaders.subset(train, d.train_subset), cfg.train.seed)
    data = Data(info, d.img_size or info.img_size, train, loaders.subset(test, d.test_subset))
    for scale in cfg.train.eval_sizes:  # built now, so that a size the data cannot render fails before training
        size = eval_size(data.img_size, scale, cfg.model.patch_size)
        if size in data.eval_sets:
            continue
        try:
            ds = data.test if size == data.img_size else loaders.subset(task.dataset(cfg, "test", size), d.test_subset)
        except Exception as e:
            raise SetupError(f"data.name={d.name!r} at img_size={size} (train.eval_sizes scale {scale}) "
                             f"could not be built: {type(e).__name__}: {e}") from e
        data.eval_sets[size] = (scale, ds)
    return data


def build_model(task, cfg: DictConfig, data: Data) -> torch.nn.Module:
    try:
        return task.model(cfg, data.info, data.img_size)
    except Exception as e:  # unknown encoding or model name, bad kwargs
        raise SetupError(f"the model (model.name={cfg.model.name!r}, model.pe={cfg.model.pe!r}) could not be built: "
                         f"{type(e).__name__}: {e}") from e


def check_model(cfg: DictConfig) -> None:
    """Build ``cfg``'s model once from the data set's description alone (no data read or written) and
    drop it: a SetupError says why it cannot be built. ``python -m vispe.sweep`` checks every point so."""
    from vispe.train.tasks import get_task

    task = get_task(cfg.task)
    try:
        info = task.info(cfg)
    except Exception as e:
        raise SetupError(f"data.name={cfg.data.name!r}: {type(e).__name__}: {e}") from e
    build_model(task, cfg, Data(info, cfg.data.img_size or info.img_size, None, None))


def build_optimizer(cfg: DictConfig, model: torch.nn.Module, task=None) -> torch.optim.Optimizer:
    """AdamW / SGD through timm, which keeps biases, norms and position tables out of weight decay;
    a task with ``param_groups`` (detection: DETR's backbone learning rate) gives the groups itself."""
    from timm.optim import create_optimizer_v2

    o = cfg.optim
    extra = {"betas": tuple(o.betas)} if o.name == "adamw" else {}
    params = task.param_groups(model, cfg) if hasattr(task, "param_groups") else model
    return create_optimizer_v2(params, opt=o.name, lr=o.lr, weight_decay=o.weight_decay, momentum=o.momentum,
                               foreach=False, **extra)


def eval_size(base: int, scale: float, patch: int) -> int:
    """``base * scale`` rounded to a multiple of the patch size (at least one patch)."""
    return max(patch, int(round(base * scale / patch)) * patch)


def machine(device: torch.device) -> str:
    """The device in words, for summaries: GPU name, or CPU model, cores and torch threads."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def run_encoding(cfg: DictConfig, task, data: Data, sub: Path, *, resume: bool, dist: D.DistInfo) -> dict:
    """Train ``cfg.model.pe`` in folder ``sub`` (resuming its checkpoint if asked); return its summary."""
    t = cfg.train
    apply_threads(t.threads)
    device = engine.resolve_device(t.device)
    if device.type == "cuda":  # this process's GPU (distributed.setup chose it from LOCAL_RANK)
        device = torch.device("cuda", torch.cuda.current_device())
    amp_dtype = engine.resolve_amp(t.amp, device)
    if t.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    seed_everything(t.seed)
    tag = task.label(cfg)  # the encoding, and a detector's design
    model = build_model(task, cfg, data).to(device)
    optimizer = build_optimizer(cfg, model, task)
    steps_per_epoch = loaders.num_train_batches(len(data.train), cfg.data.batch_size, dist)
    plan = LRPlan(cfg, steps_per_epoch, t.epochs)
    scheduler = build_scheduler(optimizer, plan)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    config = OmegaConf.to_container(cfg, resolve=True)
    path = sub / "checkpoint.pt"
    progress, resumed = ckpt.Progress(), False
    if resume and path.exists():
        state = ckpt.load(path)  # on the CPU: RNG states must stay there; load_state_dict moves the rest
        ckpt.check_compatible(state, model, config, path)
        progress, resumed = ckpt.restore(state, model=model, optimizer=optimizer, scheduler=scheduler,
                                         scaler=scaler), True
        # the schedule the checkpoint followed (older checkpoints: the one of its config's epochs)
        plan.segments = LRPlan(cfg, steps_per_epoch, state["config"]["train"]["epochs"], progress.schedule).segments
        try:
            note = plan.replan(steps_per_epoch * t.epochs, progress.step)  # train.epochs changed
        except ValueError as e:
            raise SetupError(f"--resume with train.epochs={t.epochs}: {e} ({progress.epoch} epochs in {path})") from None
        if dist.is_main:
            print(f"[{tag}] resumed from {path}: epoch {progress.epoch}, batch {progress.batch}, "
                  f"step {progress.step}", flush=True)
            if note:
                print(f"[{tag}] {note}", flush=True)
    progress.schedule = plan.segments
    if dist.enabled:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if t.compile:
        model = torch.compile(model)
    raw = ckpt.unwrap(model)
    n_params = sum(p.numel() for p in raw.parameters())
    # Every TensorBoard event of step s is on disk before the checkpoint of step s is written (see
    # `save` and the end of an epoch), so on resume the events of steps after the checkpoint's,
    # written by the stopped process, are the ones to purge: purge_step = step + 1.
    log = RunLog(sub, enabled=dist.is_main, purge_step=progress.step + 1 if resume else None)
    if resumed and progress.history:
        log.files(progress.history)  # a stop between checkpoint and CSV must not lose a row
    bs = cfg.data.batch_size
    ebs = cfg.data.eval_batch_size or 2 * bs
    pin = device.type == "cuda"
    signal_at, signal_name = (os.environ.get(SIGNAL_ENV) or "0:KILL").split(":")
    start = time.time() - progress.elapsed_s

    def save(sums: dict) -> None:  # called by every rank at the same step
        # the running sums over all ranks; on resume rank 0 starts from them and the others from 0
        progress.epoch_sums = {k: float(v) for k, v in D.all_reduce_sums(dict(sums)).items()}
        progress.elapsed_s = time.time() - start
        if dist.is_main:
            log.flush()  # the events up to this step reach the disk before the checkpoint does
            ckpt.save(path, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                      progress=progress, config=config)

    bar = None
    with engine.StopFlag() as stop:
        try:
            for epoch in range(progress.epoch, t.epochs):
                loader = loaders.train_loader(data.train, batch_size=bs, epoch=epoch, skip_batches=progress.batch,
                                              seed=t.seed, dist_info=dist, num_workers=cfg.data.num_workers,
                                              collate_fn=task.collate_fn, pin_memory=pin)
                sums = {k: torch.tensor(v if dist.is_main else 0.0, dtype=torch.float64, device=device)
                        for k, v in progress.epoch_sums.items()}
                bar = progress_bar(t.progress and dist.is_main, steps_per_epoch, progress.batch,
                                   f"[{tag}] epoch {epoch + 1}/{t.epochs}")
                t0, n0 = time.time(), float(sums.get("count", 0.0))

                def after_step(progress, sums, loss):
                    if bar is not None:
                        bar.update(1)
                    if progress.step % t.log_every == 0 or progress.batch == steps_per_epoch:
                        value = loss.item()
                        kept = f"the last checkpoint is kept in {path}" if path.exists() else "no checkpoint yet"
                        bad = float(sums.get(engine.NONFINITE_KEY, 0.0))
                        if bad:
                            raise FloatingPointError(
                                f"[{tag}] {bad:.0f} training batch(es) of epoch {epoch + 1} (up to step "
                                f"{progress.step}) hold NaN or inf input values: the data (data.name={cfg.data.name!r}, "
                                f"data.root={cfg.data.root!r}) or its transforms give non-finite pixels; {kept}")
                        if not math.isfinite(value):
                            raise FloatingPointError(f"[{tag}] training loss is {value} at step {progress.step} "
                                                     f"(lr {optimizer.param_groups[0]['lr']:.2e}); {kept}")
                        lr = optimizer.param_groups[0]["lr"]
                        log.scalars(progress.step, {"loss": value, "lr": lr}, "train")
                        if bar is not None:
                            rate = (float(sums["count"]) - n0) * dist.world_size / max(time.time() - t0, 1e-9)
                            bar.set_postfix(loss=f"{value:.4f}", lr=f"{lr:.2e}", img_s=f"{rate:.0f}")
                    if t.ckpt_every_steps and progress.step % t.ckpt_every_steps == 0:
                        save(sums)
                    if progress.step == int(signal_at):
                        os.kill(os.getpid(), getattr(signal, "SIG" + signal_name))
                    if stop.agreed(device):
                        save(sums)
                        raise engine.Interrupted

                engine.train_one_epoch(model, task, loader, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                                       device=device, amp_dtype=amp_dtype, grad_clip=cfg.optim.grad_clip,
                                       progress=progress, sums=sums, after_step=after_step)
                if bar is not None:
                    bar.close()
                train_metrics = task.metrics(D.all_reduce_sums(sums))
                seen = (float(sums["count"]) - n0) if "count" in sums else 0.0
                epoch_time = time.time() - t0
                test_metrics = {}
                if (epoch + 1) % t.eval_every == 0 or epoch + 1 == t.epochs:
                    test_loader = loaders.eval_loader(data.test, batch_size=ebs, dist_info=dist, num_workers=cfg.data.num_workers,
                                                      collate_fn=task.collate_fn, pin_memory=pin)
                    try:
                        test_metrics = engine.evaluate(model, task, test_loader, device=device, amp_dtype=amp_dtype,
                                                       should_stop=lambda: stop.agreed(device))
                    except engine.Interrupted:
                        save(sums)  # the epoch's training is complete; its evaluation runs again on resume
                        raise
                    if dist.is_main and hasattr(task, "visualize"):
                        task.visualize(raw, data.test, sub / "predictions" / f"epoch_{epoch + 1:03d}.png", device)
                row = {"epoch": epoch + 1, "step": progress.step, "lr": optimizer.param_groups[0]["lr"],
                       **{f"train_{k}": v for k, v in train_metrics.items()},
                       **{f"test_{k}": v for k, v in test_metrics.items()},
                       "epoch_time_s": round(epoch_time, 3),
                       "img_per_s": round(seen * dist.world_size / max(epoch_time, 1e-9), 1)}
                progress.history.append(row)
                progress.epoch, progress.batch = epoch + 1, 0
                log.epoch(progress.history)  # before the checkpoint: a stop in between redoes the epoch
                save({})
                if dist.is_main:
                    eta = (t.epochs - epoch - 1) * progress.elapsed_s / max(epoch + 1, 1)  # rough: mean epoch so far
                    print(f"[{tag}] epoch {epoch + 1}/{t.epochs}  " +
                          "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k.startswith(("train_", "test_"))) +
                          f"  ({epoch_time:.0f}s, {row['img_per_s']:.0f} img/s, ETA {eta / 60:.1f} min)", flush=True)
        except BaseException:  # Ctrl-C, a crash: the checkpoint and logs already written stay as they are
            if bar is not None:
                bar.close()
            log.close()
            raise
    train_time = progress.elapsed_s if progress.history else 0.0
    t0 = time.time()
    results = evaluate_sizes(raw, task, cfg, data, device=device, amp_dtype=amp_dtype, dist=dist)
    summary = {"encoding": cfg.model.pe, "label": tag, "model": cfg.model.name, "task": cfg.task.name, "data": cfg.data.name,
               "finished": True, "epochs": t.epochs, "steps": progress.step, "params": n_params,
               "primary": task.primary, "train_img_size": data.img_size,
               "final": progress.history[-1] if progress.history else {}, "eval": results,
               "train_time_s": round(train_time, 2), "eval_time_s": round(time.time() - t0, 2),
               **step_time_and_memory(progress.history, progress.step, device),
               "device": machine(device), "world_size": dist.world_size, "torch": torch.__version__,
               "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d", time.gmtime())}
    log.summary(summary)
    log.close()
    return summary


def step_time_and_memory(history: list[dict], steps: int, device: torch.device) -> dict:
    """Mean training seconds per optimiser step (epoch times, data loading included, evaluation
    excluded) and this process's peak memory in MiB: CUDA max allocated on a GPU, else max RSS."""
    step_time = sum(r.get("epoch_time_s", 0.0) for r in history) / steps if steps else None
    if device.type == "cuda":
        peak, kind = torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    else:
        import resource  # POSIX only; ru_maxrss is in KiB on Linux

        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_max_rss"
    return {"step_time_s": None if step_time is None else round(step_time, 5),
            "peak_mem_mb": round(peak, 1), "peak_mem_kind": kind}


def evaluate_sizes(model, task, cfg: DictConfig, data: Data, *, device, amp_dtype, dist: D.DistInfo) -> dict:
    """Test metrics at every ``train.eval_sizes`` scale of the training size: ``{size: metrics}``."""
    out = {}
    ebs = cfg.data.eval_batch_size or 2 * cfg.data.batch_size
    for size, (scale, ds) in data.eval_sets.items():
        loader = loaders.eval_loader(ds, batch_size=ebs, dist_info=dist, num_workers=cfg.data.num_workers,
                                     collate_fn=task.collate_fn)
        metrics = engine.evaluate(model, task, loader, device=device, amp_dtype=amp_dtype)
        out[str(size)] = {"scale": scale, **metrics}
    return out

