"""Which attention kernel each layer actually ran, read off torch's profiler (not guessed).

    rows = explain(model, images)                     # forward only
    rows = explain(model, images, backward=True)      # also the backward kernel of each layer
    python -m vispe explain --pe relbias --train --backward   # the command line (vispe.models.explain_cli)

Every attention layer (vispe's ``Attention``, or ``layer_types``) is wrapped in a profiler range
named after its module path; the kernel is the aten operator torch dispatched to inside that range:

| operator | kernel |
|---|---|
| ``aten::_scaled_dot_product_flash_attention*`` | flash |
| ``aten::_scaled_dot_product_efficient_attention`` | efficient |
| ``aten::_scaled_dot_product_cudnn_attention`` | cudnn |
| ``aten::_scaled_dot_product_attention_math`` | math |
| ``vispe::chunked_bias_attention`` | chunked (vispe's function; its forward's SDPA kernel follows) |
| ``vispe::flex_attention`` | flex |

With ``backward=True`` the sum of the outputs (every tensor in them) is back-propagated and each layer's backward is
found through the autograd sequence number that links a forward operator to its backward node.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

KERNELS = (  # (operator name prefix, kernel); first match wins
    ("vispe::chunked_bias_attention", "chunked"),
    ("vispe::flex_attention", "flex"),
    ("aten::_scaled_dot_product_flash_attention", "flash"),
    ("aten::_scaled_dot_product_efficient_attention", "efficient"),
    ("aten::_scaled_dot_product_cudnn_attention", "cudnn"),
    ("aten::_scaled_dot_product_fused_attention_overrideable", "overrideable"),
    ("aten::_scaled_dot_product_attention_math", "math"),
)
RANGE = "vispe.explain::"


@dataclass
class LayerKernels:
    layer: str  # module path, e.g. "blocks.0.attn"
    forward: list[str] = field(default_factory=list)  # kernels in call order, e.g. ["chunked", "flash"]
    backward: list[str] = field(default_factory=list)  # backward node names, e.g. ["BiasedAttentionBackward"]

    @property
    def kernel(self) -> str:
        """The layer's kernel in one word ("flash", "math", "chunked+flash", ...)."""
        return "+".join(dict.fromkeys(self.forward)) or "none"


def _kernel(name: str) -> str | None:
    return next((k for prefix, k in KERNELS if name.startswith(prefix)), None)


def _tensors(out):
    """Every tensor in a model's output (a tensor, or dicts / lists / tuples of them)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):
        for v in out.values():
            yield from _tensors(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from _tensors(v)


def _descendants(ev):
    for c in ev.cpu_children:
        yield c
        yield from _descendants(c)


def explain(model: nn.Module, *inputs, backward: bool = False, layer_types: tuple | None = None,
            **kwargs) -> list[LayerKernels]:
    """Run ``model(*inputs, **kwargs)`` under the profiler and report each attention layer's kernels."""
    if layer_types is None:
        from vispe.attention import Attention

        layer_types = (Attention,)
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, layer_types)]
    if not layers:
        raise ValueError(f"the model has no attention layer of types {[t.__name__ for t in layer_types]}")
    ranges, handles = {}, []
    for name, m in layers:
        def pre(mod, args, name=name):
            ranges[name] = record_function(RANGE + name)
            ranges[name].__enter__()

        def post(mod, args, out, name=name):
            ranges.pop(name).__exit__(None, None, None)
        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    try:
        with profile(activities=acts) as prof:
            out = model(*inputs, **kwargs)
            if backward:
                torch.stack([t.float().sum() for t in _tensors(out) if t.requires_grad]).sum().backward()
    finally:
        for h in handles:
            h.remove()
    events = prof.events()
    by_seq = {}
    for ev in events:
        if ev.name.startswith("autograd::engine::evaluate_function:") and ev.sequence_nr >= 0:
            by_seq.setdefault(ev.sequence_nr, []).append(ev.name.split("evaluate_function:", 1)[1].strip())
    rows = {name: LayerKernels(name) for name, _ in layers}
    for ev in events:
        if not ev.name.startswith(RANGE):
            continue
        row = rows[ev.name[len(RANGE):]]
        for d in _descendants(ev):
            k = _kernel(d.name)
            if k is None:
                continue
            row.forward.append(k)
            if backward:  # the backward nodes of this operator and of what it ran (math: its decomposition)
                for e in (d, *_descendants(d)):
                    if e.sequence_nr >= 0:
                        row.backward += [b for b in by_seq.get(e.sequence_nr, []) if b not in row.backward]
    return [rows[name] for name, _ in layers]


if __name__ == "__main__":  # the command line builds a model, so it lives above the models (imports go one way)
    import runpy

    runpy.run_module("vispe.models.explain_cli", run_name="__main__", alter_sys=True)
