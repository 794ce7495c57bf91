"""How the audit runs a model it knows nothing about: the call, its sizes, and what it records.

``Target`` wraps a model with the call that feeds it images (timm: ``model(x)``; transformers:
``model(pixel_values=x)``, a padding mask as ``pixel_mask``; vispe: ``model(x, mask=mask)``), its
patch size and native size (read from its patch embedding or config, else given), and
``record``: one forward pass under a ``TorchFunctionMode`` that sees every
``scaled_dot_product_attention`` call (q, k, the logits mask, the output and the module that made
it), with forward pre-hooks where a probe asks for them, optionally stopping after the n-th
attention call so that probes of the first layers cost a few layers, not the whole model.

Nothing here changes the model: the audit runs it in eval mode under ``no_grad`` and puts every
module's mode back (``preserved``); vispe's ``Attention`` layers run their reference kernel during
the audit (their chunked bias kernel does not call SDPA), restored afterwards.
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

Call = Callable[[nn.Module, torch.Tensor, "torch.Tensor | None"], Any]


@dataclass
class Attn:
    """One ``scaled_dot_product_attention`` call."""

    module: str  # the name of the module that called it ("" when none was found)
    q: torch.Tensor  # (B, heads, Lq, d)
    k: torch.Tensor  # (B, heads, Lk, d)
    mask: torch.Tensor | None  # the attn_mask passed, (B|1, heads|1, Lq, Lk) or None
    out: torch.Tensor  # (B, heads, Lq, d)


@dataclass
class Record:
    attn: list[Attn] = field(default_factory=list)
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # pre-hooked module -> its first tensor input
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # hooked module -> its first tensor output
    pos_inputs: list[tuple[str, str, torch.Tensor]] = field(default_factory=list)  # (module, argument, tensor)
    error: BaseException | None = None


class _Stop(Exception):
    pass


class _SDPA(TorchFunctionMode):
    def __init__(self, rec: Record, names: dict[int, str], stop_after: int | None):
        super().__init__()
        self.rec, self.names, self.stop_after = rec, names, stop_after

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            mask = mask.detach() if isinstance(mask, torch.Tensor) else None
            self.rec.attn.append(Attn(self._caller(), args[0].detach(), args[1].detach(), mask, out.detach()))
            if self.stop_after is not None and len(self.rec.attn) >= self.stop_after:
                raise _Stop
        return out

    def _caller(self) -> str:
        frame: Any = sys._getframe(2)
        while frame is not None:
            for key in ("self", "module"):
                obj = frame.f_locals.get(key)
                if isinstance(obj, nn.Module) and id(obj) in self.names:
                    return self.names[id(obj)]
            frame = frame.f_back
        return ""


def default_call(model: nn.Module, images: torch.Tensor, mask: torch.Tensor | None) -> Any:
    """Feed ``images`` (B, 3, H, W) and a padding mask (B, H, W), True = padding, as the model names them."""
    params = inspect.signature(model.forward).parameters
    if "pixel_values" in params:
        kw: dict[str, Any] = {"pixel_values": images}
        if mask is not None:
            kw["pixel_mask"] = (~mask).long()  # transformers: 1 = valid
        return model(**kw)
    if mask is not None:
        return model(images, mask=mask)
    return model(images)


def takes_mask(model: nn.Module) -> bool:
    params = inspect.signature(model.forward).parameters
    return "pixel_mask" in params or "mask" in params


def _pair(v: Any) -> tuple[int, int] | None:
    if isinstance(v, int):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return (int(v[0]), int(v[1]))
    return None


def find_patch(model: nn.Module) -> tuple[int, int] | None:
    """The stride of the first convolution whose kernel equals its stride (a patch embedding)."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d) and m.kernel_size == m.stride and m.stride[0] > 1:
            return (int(m.stride[0]), int(m.stride[1]))
    return None


def find_native(model: nn.Module) -> tuple[int, int] | None:
    """The size the model was configured for: timm's ``patch_embed.img_size``, a config's ``image_size``."""
    pe = getattr(model, "patch_embed", None)
    if pe is not None and _pair(getattr(pe, "img_size", None)):
        return _pair(pe.img_size)
    cfg = getattr(model, "config", None)
    for c in (cfg, getattr(cfg, "backbone_config", None), getattr(cfg, "vision_config", None)):
        if c is not None and _pair(getattr(c, "image_size", None)):
            return _pair(c.image_size)
    return None


class Target:
    """A model with its call, patch size and native size (``patch``, ``native``: pixels, (h, w))."""

    def __init__(self, model: nn.Module, *, call: Call | None = None, patch: tuple[int, int] | None = None,
                 native: tuple[int, int] | None = None, channels: int = 3) -> None:
        if not isinstance(model, nn.Module):
            raise ValueError(f"model is a {type(model).__name__}: expected a torch.nn.Module")
        self.model, self.call = model, call or default_call
        self.patch = patch or find_patch(model) or (16, 16)
        self.native = native or find_native(model) or (14 * self.patch[0], 14 * self.patch[1])
        self.channels = channels
        self.takes_mask = call is None and takes_mask(model)
        self.names = {id(m): n for n, m in model.named_modules()}
        self.modules = dict(model.named_modules())
        try:
            p = next(model.parameters())
            self.device, self.dtype = p.device, (p.dtype if p.is_floating_point() else torch.float32)
        except StopIteration:
            self.device, self.dtype = torch.device("cpu"), torch.float32

    @property
    def native_grid(self) -> tuple[int, int]:  # (h, w) patches
        return (self.native[0] // self.patch[0], self.native[1] // self.patch[1])

    def pixels(self, grid: tuple[int, int]) -> tuple[int, int]:
        return (grid[0] * self.patch[0], grid[1] * self.patch[1])

    def images(self, grid: tuple[int, int], *, seed: int = 0, batch: int = 1, constant: bool = False) -> torch.Tensor:
        H, W = self.pixels(grid)
        if constant:
            return torch.zeros(batch, self.channels, H, W, device=self.device, dtype=self.dtype)  # (B, 3, H, W)
        g = torch.Generator().manual_seed(seed)
        return torch.randn(batch, self.channels, H, W, generator=g).to(self.device, self.dtype)  # (B, 3, H, W)

    def record(self, images: torch.Tensor, mask: torch.Tensor | None = None, *, stop_after: int | None = None,
               hook_inputs: tuple[str, ...] = (), hook_outputs: tuple[str, ...] = (), replace: dict[str, Callable[[torch.Tensor], torch.Tensor]] | None = None,
               pos_inputs: bool = False, autocast: torch.dtype | None = None) -> Record:
        """One forward pass; an exception from the model is kept in ``Record.error``, not raised."""
        rec = Record()
        handles = []
        replace = replace or {}

        def pre_hook(name: str) -> Any:
            def hook(mod: nn.Module, args: Any, kwargs: Any) -> Any:
                for i, a in enumerate(args):
                    if isinstance(a, torch.Tensor) and a.is_floating_point():
                        if name in replace:
                            args = (*args[:i], replace[name](a), *args[i + 1:])
                        rec.inputs.setdefault(name, args[i].detach())
                        return args, kwargs
                for key, a in kwargs.items():
                    if isinstance(a, torch.Tensor) and a.is_floating_point():
                        if name in replace:
                            kwargs = {**kwargs, key: replace[name](a)}
                        rec.inputs.setdefault(name, kwargs[key].detach())
                        return args, kwargs
                return None
            return hook

        def pos_hook(name: str) -> Any:
            def hook(mod: nn.Module, args: Any, kwargs: Any) -> None:
                for key, a in kwargs.items():
                    if "pos" in key.lower() and isinstance(a, torch.Tensor) and a.is_floating_point():
                        rec.pos_inputs.append((name, key, a.detach()))
            return hook

        def out_hook(name: str) -> Any:
            def hook(mod: nn.Module, args: Any, out: Any) -> None:
                out = out[0] if isinstance(out, (tuple, list)) and out else out
                if isinstance(out, torch.Tensor):
                    rec.outputs.setdefault(name, out.detach())
            return hook

        for name in hook_outputs:
            handles.append(self.modules[name].register_forward_hook(out_hook(name)))
        for name in set(hook_inputs) | set(replace):
            handles.append(self.modules[name].register_forward_pre_hook(pre_hook(name), with_kwargs=True))
        if pos_inputs:
            for name, m in self.modules.items():
                if name:
                    handles.append(m.register_forward_pre_hook(pos_hook(name), with_kwargs=True))
        try:
            with torch.no_grad(), _SDPA(rec, self.names, stop_after):
                if autocast is not None:
                    with torch.autocast(images.device.type, dtype=autocast):
                        self.call(self.model, images, mask)
                else:
                    self.call(self.model, images, mask)
        except _Stop:
            pass
        except Exception as e:  # the model's own refusal is a finding, not an audit failure
            rec.error = e
        finally:
            for h in handles:
                h.remove()
        return rec


@contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Eval mode and vispe's reference attention kernel for the audit; every module's mode and
    kernel choice back afterwards (weights are never written)."""
    modes = [(m, m.training) for m in model.modules()]
    impls: list[tuple[Any, Any]] = [(m, m.__dict__.get("bias_impl")) for m in model.modules() if hasattr(m, "bias_impl")]
    model.eval()
    for m, _ in impls:
        m.bias_impl = "reference"
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode
        for m, impl in impls:
            if impl is None:
                m.__dict__.pop("bias_impl", None)
            else:
                m.bias_impl = impl


def error_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
