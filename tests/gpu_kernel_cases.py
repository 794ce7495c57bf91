"""Which attention kernel runs on CUDA: the kernel report's cases, and the GPU's own reading of them.

``vispe.kernels.explain`` names each layer's kernel from the aten operator torch dispatched to (the host
side). The tier checks it against what the GPU executed: the CUDA kernels the profiler records on the
device, classified by the names of the kernels each backend launches (``DEVICE_NAMES``), a reading
independent of the report's. The cases cover every kernel the report names: flash, memory-efficient and
math forced through ``torch.nn.attention.sdpa_kernel``, flex and vispe's chunked bias kernel through
``bias_impl``, each with a padding mask and a bias where the kernel takes one, and every registered
encoding with torch's own choice (whatever it picks, report and GPU must agree).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from gpu_cases import ENCODINGS, vit, vit_batch

from vispe.kernels import set_impl
from vispe.kernels.explain import explain

#: fragments of the CUDA kernel names each backend launches (forward and backward): FlashAttention's
#: ``flash_fwd_kernel`` / ``flash_bwd_...``; the memory-efficient (xFormers / CUTLASS) kernels
#: ``fmha_cutlassF_...`` / ``fmha_cutlassB_...``; cuDNN's fused SDPA engines; Inductor's template kernels
#: (``triton_tem_...``) for flex_attention compiled. The math kernel launches no fused attention kernel, only
#: products and a softmax (``MATH_NAMES``).
DEVICE_NAMES = {
    "flash": ("flash_fwd", "flash_bwd", "flash_attn", "FlashAttn", "pytorch_flash"),
    "efficient": ("fmha_cutlass", "MemEffAttention", "AttentionKernel", "AttentionBackwardKernel"),
    "cudnn": ("cudnn_generated", "cudnn_sdpa", "native_sdpa"),
    "flex": ("triton_tem",),
}
MATH_NAMES = ("softmax", "SoftMax")


def device_backends(names: list[str]) -> set[str]:
    """The attention backends whose kernels are among the CUDA kernel ``names`` ("math" when only a
    softmax ran)."""
    found = {b for b, frags in DEVICE_NAMES.items() if any(f in n for n in names for f in frags)}
    if not found and any(f in n for n in names for f in MATH_NAMES):
        found.add("math")
    return found


def report_backends(rows) -> set[str]:
    """The attention backends the kernel report names over all layers (``chunked`` is vispe's function:
    the SDPA kernel it runs inside is the one on the device)."""
    return {k for r in rows for k in r.forward if k != "chunked"}


@dataclass(frozen=True)
class KernelCase:
    label: str  # kernel-encoding-dtype-mask ("auto": torch's choice of SDPA kernel)
    pe: str
    bf16: bool = True  # under bf16 autocast
    mask: bool = True  # a padded batch (the key padding mask)
    bias_impl: str | None = None  # vispe.kernels.set_impl(model, bias=...)
    backend: str | None = None  # forced: a torch.nn.attention.SDPBackend name
    expect: str | None = None  # the report's word for every layer (None: torch's choice, report == GPU)


FORCED = [
    KernelCase("flash-rope_axial-bf16-nomask", "rope_axial", mask=False, backend="FLASH_ATTENTION", expect="flash"),
    KernelCase("efficient-rope_axial-bf16-mask", "rope_axial", backend="EFFICIENT_ATTENTION", expect="efficient"),
    KernelCase("efficient-sine-float32-mask", "sine", bf16=False, backend="EFFICIENT_ATTENTION", expect="efficient"),
    KernelCase("efficient-relbias-bf16-mask", "relbias", backend="EFFICIENT_ATTENTION", expect="efficient"),
    KernelCase("math-relbias-bf16-mask", "relbias", backend="MATH", expect="math"),
    KernelCase("flex-relbias-bf16-mask", "relbias", bias_impl="flex", expect="flex"),
    KernelCase("chunked-relbias-float32-mask", "relbias", bf16=False, bias_impl="chunked",
               backend="EFFICIENT_ATTENTION", expect="chunked+efficient"),
    KernelCase("chunked-irpe_contextual-float32-mask", "irpe", bf16=False, bias_impl="chunked",
               backend="EFFICIENT_ATTENTION", expect="chunked+efficient"),
]
KERNEL_CASES = FORCED + [KernelCase(f"auto-{n}", n) for n in ENCODINGS]


def kernel_model(case: KernelCase, device):
    """The case's ViT on ``device`` in training mode (dropout 0: every kernel may take it), and a step
    closure: forward and backward of its logits' sum under the case's autocast and forced backend."""
    import contextlib

    kw = {"pe_kwargs": {"contextual": True}} if case.pe == "irpe" else {}
    m = vit(case.pe, **kw).to(device).train()
    if case.bias_impl:
        set_impl(m, bias=case.bias_impl)
    x, mask = vit_batch(device)
    mask = mask if case.mask else None

    def context():
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=case.bf16))
        if case.backend:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel(getattr(SDPBackend, case.backend)))
        return stack

    def report():
        with context():
            return explain(m, x, backward=True, mask=mask)

    def step():
        with context():
            out = m(x, mask=mask)
        out.float().sum().backward()
    return m, report, step


def cuda_kernel_names(step) -> list[str]:
    """The names of the CUDA kernels ``step()`` launched (the profiler's device-side events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if str(e.device_type).endswith("CUDA")})
