"""Export a vispe ViT with dynamic batch, height and width: ``torch.export`` and ONNX.

    from vispe.export import export, export_onnx, run_onnx
    ep = export(model)                                   # torch.export.ExportedProgram
    onnx_program = export_onnx(model, "vit.onnx")        # torch.onnx.export(..., dynamo=True)
    logits = run_onnx("vit.onnx", images)                # onnxruntime, any (B, 3, H, W)

The image height and width are exported as multiples of the patch size (``H = p_h * grid_h``),
so the patch-size check holds symbolically and every encoding computes its positions from the
symbolic grid: fixed tables recompute, learned tables resample (``learned_abs`` picks the
antialiased or plain kernel at run time, as in eager mode), relative tables re-index or resize.
The exported program and the ONNX model give the eager model's logits at every size, not only at
the export size (tested for every registered encoding at the export size and a non-square one).

What is not exported: the padding mask (``mask=None``; export a mask-aware model with a wrapper
that takes the mask if needed), training-time augmentation (export in eval mode: this module does
``model.eval()`` on a copy of the flag and restores it). TorchScript (``torch.jit.trace`` /
``torch.jit.script``) is not supported: a trace records the grid as constants, so vispe refuses it
with a clear error (``vispe._tracing.refuse_jit_trace``).
"""
from __future__ import annotations

import contextlib
import inspect
from pathlib import Path

import torch
from torch.export import Dim

from vispe import _checks


def _patch_size(model) -> tuple[int, int]:
    pe = getattr(model, "patch_embed", None)
    if pe is None or not hasattr(pe, "patch_size"):
        raise ValueError(f"model is a {type(model).__name__}: expected a vispe ViT (create_vit / convert_vit) "
                         "with a patch_embed")
    return tuple(pe.patch_size)


def example_input(model, batch: int = 2, grid=None) -> torch.Tensor:
    """A random image batch ``(batch, C, p_h * h, p_w * w)`` on the model's device.

    ``grid`` (h, w) defaults to the model's own grid (the size where learned tables are used as
    they are: exporting there is what would bake an "unchanged table" branch into the graph if the
    code had one, so the tests export there).
    """
    ph, pw = _patch_size(model)
    if grid is None:
        grid = tuple(model.patch_embed.grid_size)
    h, w = _checks.grid_shape("grid", grid)
    _checks.positive_int("batch", batch)
    if batch < 2:
        raise ValueError(f"batch={batch}: expected at least 2 (torch.export specialises a size-1 dimension)")
    p = next(model.parameters())
    return torch.randn(batch, model.patch_embed.proj.in_channels, ph * h, pw * w, device=p.device, dtype=p.dtype)


def dynamic_shapes(model, *, max_grid=None) -> dict:
    """``torch.export`` dynamic shapes of ``model(x)``: batch, and H, W as multiples of the patch size,
    keyed by the name of ``model.forward``'s image argument (``x`` for a vispe ViT, ``pixel_values``
    for a converted transformers tower).

    ``max_grid`` (h, w) bounds the grid (None: unbounded).
    """
    ph, pw = _patch_size(model)
    mh, mw = (None, None) if max_grid is None else _checks.grid_shape("max_grid", max_grid)
    gh = Dim("grid_h", min=1, max=mh) if mh else Dim("grid_h", min=1)
    gw = Dim("grid_w", min=1, max=mw) if mw else Dim("grid_w", min=1)
    name = next(iter(inspect.signature(model.forward).parameters))
    return {name: {0: Dim("batch", min=1), 2: ph * gh, 3: pw * gw}}


@contextlib.contextmanager
def _eval(model):
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)


def export(model, example: torch.Tensor | None = None, *, max_grid=None, strict: bool = False):
    """``torch.export.export`` of ``model`` in eval mode with dynamic batch, height and width."""
    x = example_input(model) if example is None else example
    with _eval(model), torch.no_grad():
        return torch.export.export(model, (x,), dynamic_shapes=dynamic_shapes(model, max_grid=max_grid),
                                   strict=strict)


def export_onnx(model, path: str | Path | None = None, example: torch.Tensor | None = None, *,
                max_grid=None, opset_version: int | None = None):
    """``torch.onnx.export(..., dynamo=True)`` with dynamic batch, height and width.

    Input ``x`` (B, C, H, W), output ``logits``. Saved to ``path`` when given; returns the
    ``torch.onnx.ONNXProgram`` (its ``exported_program`` is the torch.export program).
    """
    x = example_input(model) if example is None else example
    kw = {} if opset_version is None else {"opset_version": opset_version}
    with _eval(model), torch.no_grad():
        program = torch.onnx.export(model, (x,), dynamo=True, dynamic_shapes=dynamic_shapes(model, max_grid=max_grid),
                                    input_names=["x"], output_names=["logits"], verbose=False, **kw)
    if path is not None:
        program.save(str(path))
    return program


def onnx_session(model_or_path):
    """An onnxruntime CPU session of an ONNX file, bytes or ``ONNXProgram``."""
    import onnxruntime as ort

    if hasattr(model_or_path, "model_proto"):
        model_or_path = model_or_path.model_proto.SerializeToString()
    elif isinstance(model_or_path, Path):
        model_or_path = str(model_or_path)
    return ort.InferenceSession(model_or_path, providers=["CPUExecutionProvider"])


def run_onnx(model_or_session, x: torch.Tensor) -> torch.Tensor:
    """Logits of images ``x`` (B, C, H, W) from an ONNX model (file, bytes, ONNXProgram or session)."""
    sess = model_or_session if hasattr(model_or_session, "run") else onnx_session(model_or_session)
    name = sess.get_inputs()[0].name
    return torch.from_numpy(sess.run(None, {name: x.detach().cpu().float().numpy()})[0])
