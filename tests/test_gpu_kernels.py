"""CUDA tier (marker ``gpu``): the attention kernels and vispe's own kernels on CUDA.

* the kernel report (``vispe.kernels.explain``, ``python -m vispe explain``) names the kernel the GPU ran:
  flash, memory-efficient and math forced, flex and vispe's chunked bias kernel chosen, each with a padding
  mask and a bias where it takes one, and torch's own choice for every registered encoding; the GPU's
  reading is the CUDA kernels the profiler recorded on the device (tests/gpu_kernel_cases.py);
* forward and backward against the CPU (float32, TF32 off) of the deformable sampling
  (``vispe.kernels.deformable``), the block rotations (``vispe.kernels.rope_blocks``, every registered
  encoding that returns them) and the relative-bias kernel (``vispe.kernels.relative_bias``, every path).
"""
from __future__ import annotations

import pytest
import torch
from gpu_cases import ENCODINGS, F32_TOL, no_tf32, skip_reason, tol_used
from gpu_kernel_cases import KERNEL_CASES, cuda_kernel_names, device_backends, kernel_model, report_backends

import vispe
from conftest import build_for_test
from vispe.kernels import deformable, relative_bias, rope_blocks
from vispe.kernels.bias_attention import attend

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=[c.label for c in KERNEL_CASES])
def test_the_kernel_report_names_the_kernel_the_gpu_ran(case):
    _, report, step = kernel_model(case, "cuda")
    rows = report()
    said = report_backends(rows)
    ran = device_backends(cuda_kernel_names(step))
    assert said and said == ran, f"{case.label}: the report says {[r.kernel for r in rows]}, the GPU ran {ran}"
    if case.expect is not None:
        assert {r.kernel for r in rows} == {case.expect}, [r.kernel for r in rows]
    assert all(r.backward for r in rows), f"{case.label}: no backward kernel reported"


# --------------------------------------------------------------- vispe's kernels, forward and backward
def grads_of(fn, inputs: list[torch.Tensor], device) -> list[torch.Tensor]:
    """``fn`` on copies of ``inputs`` moved to ``device``: its output and every input's gradient of a fixed
    random projection of it."""
    xs = [t.detach().to(device).requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*xs)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(device)
    (out * w).sum().backward()
    return [out] + [x.grad for x in xs if x.requires_grad]


def against_cpu(fn, inputs, device) -> float:
    """``tol_used`` by ``fn``'s output and input gradients on ``device`` against the CPU."""
    with no_tf32():
        return tol_used(grads_of(fn, inputs, device), grads_of(fn, inputs, "cpu"))


def deformable_inputs():
    """Two levels (5 x 7, 3 x 4), 2 heads of 8 channels, 6 queries, 3 points; locations partly outside the map."""
    g = torch.Generator().manual_seed(0)
    levels = deformable.Levels(((5, 7), (3, 4)))
    B, Q, M, D, P = 2, 6, 2, 8, 3
    value = torch.randn(B, levels.num_tokens, M, D, generator=g)
    locations = torch.rand(B, Q, M, len(levels), P, 2, generator=g) * 1.2 - 0.1  # (y, x), some outside [0, 1]
    weights = torch.rand(B, Q, M, len(levels), P, generator=g).softmax(-1)
    return levels, [value, locations, weights]


def check_deformable(device) -> float:
    levels, inputs = deformable_inputs()
    return against_cpu(lambda v, loc, w: deformable.ms_deform_attn(v, levels, loc, w), inputs, device)


def test_deformable_sampling_forward_and_backward_against_cpu():
    used = check_deformable("cuda")
    assert used <= 1.0, f"{used:.2f}x the {F32_TOL} tolerance"


def block_encoding(name):
    return build_for_test(name, grid=(3, 5), dim=32, heads=2)


#: every registered encoding whose default build returns block rotations (the rotary contract's second form)
BLOCKS = [n for n in ENCODINGS if vispe.family_of(n) == "rotary" and block_encoding(n).block_size > 2]


def check_block_rotations(name, device) -> float:
    """q and k rotated by the block rotations of encoding ``name`` (generators perturbed), with a padding
    mask and a prefix token: output and the gradients of q, k and the generators, against the CPU."""
    pe = block_encoding(name)
    with torch.no_grad():
        for p in pe.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.1)
    mask = torch.zeros(2, 3, 5, dtype=torch.bool)
    mask[1, :, 3:] = True
    qk = torch.randn(2, 2, 2, 1 + 15, 16, generator=torch.Generator().manual_seed(2))  # (q|k, B, heads, P+N, hd)

    def run(dev):
        m = __import__("copy").deepcopy(pe).to(dev)
        x = qk.to(dev).requires_grad_()
        out = rope_blocks.rotate_qk(m, x, (3, 5), mask.to(dev), num_prefix_tokens=1)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(dev)
        (out * w).sum().backward()
        return [out, x.grad] + [p.grad for p in m.parameters()]
    with no_tf32():
        return tol_used(run(device), run("cpu"))


@pytest.mark.parametrize("name", BLOCKS)
def test_block_rotations_forward_and_backward_against_cpu(name):
    used = check_block_rotations(name, "cuda")
    assert used <= 1.0, f"{name}: {used:.2f}x the {F32_TOL} tolerance"


def relative_inputs():
    """Two images of one prefix and 4 x 6 tokens, 2 heads of 8, a relative table ((2h-1)(2w-1), heads) with
    prefix scalars, the second image's last two columns padded."""
    g = torch.Generator().manual_seed(0)
    h, w, P, H, d = 4, 6, 1, 2, 8
    L = P + h * w
    q, k, v = (torch.randn(2, H, L, d, generator=g) for _ in range(3))
    table = torch.randn((2 * h - 1) * (2 * w - 1), H, generator=g)
    prefix = [torch.randn(H, P, P, generator=g), torch.randn(H, P, generator=g), torch.randn(H, P, generator=g)]
    kpm = torch.zeros(2, L, dtype=torch.bool)
    kpm[1, P:] = torch.zeros(h, w, dtype=torch.bool).index_fill_(1, torch.tensor([w - 2, w - 1]), True).flatten()
    return (h, w), kpm, [q, k, v, table, *prefix]


def relative_fn(impl, shape, kpm):
    def fn(q, k, v, table, p2p, p2t, t2p):
        def dense():  # the dense bias (1, heads, L, L) from the table: the encoding's rule, written out
            h, w = shape
            ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            dy = ys.flatten()[:, None] - ys.flatten()[None, :] + h - 1
            dx = xs.flatten()[:, None] - xs.flatten()[None, :] + w - 1
            grid = table[(dy * (2 * w - 1) + dx).to(table.device)].permute(2, 0, 1)  # (heads, N, N)
            top = torch.cat([p2p, p2t[:, :, None].expand(-1, -1, grid.shape[-1])], -1)  # (heads, P, L)
            rest = torch.cat([t2p[:, None, :].expand(-1, grid.shape[-1], -1), grid], -1)  # (heads, N, L)
            return torch.cat([top, rest], 1)[None]
        bias = relative_bias.RelativeBias(table=table, shape=shape, prefix=(p2p, p2t, t2p), dense=dense)
        mask = kpm.to(q.device)
        if impl == "relative":  # the kernel itself, forced
            return relative_bias.relative_attention(q, k, v, bias, mask)
        return relative_bias.attend_relative(q, k, v, bias, key_padding_mask=mask, impl=impl)
    return fn


RELATIVE_IMPLS = ["relative", "chunked", "reference", "auto", "flex"]


def check_relative(impl, device) -> float:
    """``impl`` on ``device`` against SDPA with the dense bias on the CPU ("reference"), output and the
    gradients of q, k, v, the table and the prefix scalars."""
    shape, kpm, inputs = relative_inputs()
    with no_tf32():
        return tol_used(grads_of(relative_fn(impl, shape, kpm), inputs, device),
                        grads_of(relative_fn("reference", shape, kpm), inputs, "cpu"))


@pytest.mark.parametrize("impl", RELATIVE_IMPLS)
def test_relative_bias_kernel_forward_and_backward_against_cpu(impl):
    used = check_relative(impl, "cuda")
    assert used <= 1.0, f"impl={impl}: {used:.2f}x the {F32_TOL} tolerance"


def check_dense_bias(impl, device) -> float:
    """``bias_attention.attend`` with a dense bias (B, heads, L, L) that learns and a padding mask, path
    ``impl`` on ``device`` against "reference" on the CPU."""
    _, kpm, (q, k, v, *_) = relative_inputs()
    bias = torch.randn(2, 2, q.shape[2], q.shape[2], generator=torch.Generator().manual_seed(7))

    def fn(impl):
        return lambda q, k, v, b: attend(q, k, v, bias=b, key_padding_mask=kpm.to(q.device), impl=impl)
    with no_tf32():
        return tol_used(grads_of(fn(impl), [q, k, v, bias], device), grads_of(fn("reference"), [q, k, v, bias], "cpu"))


@pytest.mark.parametrize("impl", ["reference", "chunked", "flex", "auto"])
def test_a_dense_bias_through_every_path_against_cpu(impl):
    used = check_dense_bias(impl, "cuda")
    assert used <= 1.0, f"impl={impl}: {used:.2f}x the {F32_TOL} tolerance"
