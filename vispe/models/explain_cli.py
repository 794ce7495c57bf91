"""``python -m vispe explain``: which attention kernel each layer of a vispe ViT ran.

    python -m vispe explain --pe relbias --train --backward   # blocks.0.attn  chunked+flash  backward: ...
    python -m vispe explain --pe rope_mixed --pad 8           # blocks.0.attn  flash

The command line of ``vispe.kernels.explain.explain`` (the profiler reading), here because it builds
a model: imports go one way (axis -> image -> attention -> models -> train), so ``vispe.kernels``
never imports ``vispe.models``. ``python -m vispe.kernels.explain`` still runs this command.

A bad option (an unknown encoding or model, a CUDA device on a machine without one) is a usage error
naming it (exit 2), not a traceback. The profiler's own log lines on stderr (kineto's "USDT ...
profiler_start", and on a machine without a GPU "ERROR: ... gpuGetDeviceCount failed with code 35",
which is harmless: there is no GPU to count) are filtered out; any other line passes through.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile

import torch

PROG = "python -m vispe explain"
#: kineto's log lines that say nothing about the result (``<LEVEL>:<date> <pid>:<tid> <file>.cpp:<line>] ...``)
NOISE = re.compile(r"^(USDT|STAGE|INFO|VERBOSE):\S+ \S+ \d+:\d+ \w+\.cpp:\d+\]|"
                   r"^ERROR:\S+ \S+ \d+:\d+ DeviceProperties\.cpp:\d+\] gpuGetDeviceCount failed")


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default in its help."""


def parser() -> argparse.ArgumentParser:
    examples = __doc__.split("\n\n")[1]
    ap = argparse.ArgumentParser(prog=PROG, formatter_class=_Formatter, description=(
        "Which attention kernel (flash, efficient, math, chunked, flex...) each layer of a vispe ViT\n"
        "ran, read off torch's profiler.\n\n" + examples))
    ap.add_argument("--model", default="vit_cifar", help="a vispe preset (vit_pico, vit_nano, vit_cifar, vit_tiny, "
                                                         "vit_small) or a timm ViT name")
    ap.add_argument("--pe", default="relbias", help="the encoding (python -m vispe lists them)")
    ap.add_argument("--img-size", type=int, default=32, help="image height and width in pixels")
    ap.add_argument("--patch-size", type=int, default=4, help="patch size in pixels")
    ap.add_argument("--batch", type=int, default=2, help="images per batch")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cpu or cuda (cuda when this machine has a GPU)")
    ap.add_argument("--bf16", action="store_true", help="run under bf16 autocast")
    ap.add_argument("--train", action="store_true", help="training mode, gradients on")
    ap.add_argument("--backward", action="store_true", help="also report each layer's backward kernels (with --train)")
    from vispe.kernels.bias_attention import BIAS_IMPLS
    from vispe.kernels.rope import ROPE_IMPLS

    # "%(default).0s" prints nothing: it only tells the formatter that the help gives the default itself
    ap.add_argument("--rope-impl", default=None, help=f"rotary implementation, one of {', '.join(ROPE_IMPLS)} "
                                                      "(default: the layer's own)%(default).0s")
    ap.add_argument("--bias-impl", default=None, help=f"relative-bias implementation, one of {', '.join(BIAS_IMPLS)} "
                                                      "(default: the layer's own)%(default).0s")
    ap.add_argument("--pad", type=int, default=0, help="pad this many pixel columns of image 0 (adds a padding mask)")
    return ap


@contextlib.contextmanager
def quiet_profiler_logs():
    """Hold back the process's stderr (file descriptor 2: kineto writes there from C++) and pass
    on every line but kineto's ``NOISE``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().decode(errors="replace").splitlines() if not NOISE.match(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


def main(argv=None) -> int:
    from vispe.kernels import set_impl
    from vispe.kernels.bias_attention import BIAS_IMPLS
    from vispe.kernels.explain import explain
    from vispe.kernels.rope import ROPE_IMPLS
    from vispe.models.vit import create_vit
    from vispe.registry import available, suggest

    ap = parser()
    args = ap.parse_args(argv)
    if args.pe not in available():
        near = suggest(args.pe)
        ap.error(f"--pe {args.pe!r}: unknown encoding{' (did you mean ' + ', '.join(near) + '?)' if near else ''}; "
                 f"expected one of {', '.join(available())}")
    for opt, value, impls in (("--rope-impl", args.rope_impl, ROPE_IMPLS), ("--bias-impl", args.bias_impl, BIAS_IMPLS)):
        if value is not None and value not in impls:
            ap.error(f"{opt} {value!r}: expected one of {', '.join(impls)}")
    for opt, value in (("--img-size", args.img_size), ("--patch-size", args.patch_size), ("--batch", args.batch)):
        if value < 1:
            ap.error(f"{opt} {value}: expected a positive integer")
    if args.backward and not args.train:
        ap.error("--backward: needs --train (in eval mode no gradient flows, so no backward kernel runs)")
    if not 0 <= args.pad < args.img_size:
        ap.error(f"--pad {args.pad}: expected 0 <= pad < --img-size {args.img_size} (image 0 keeps a valid column)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device!r}: this machine has no CUDA GPU (torch {torch.__version__}); use --device cpu")
    try:
        m = create_vit(args.model, pe=args.pe, img_size=args.img_size, patch_size=args.patch_size).to(args.device)
    except (ValueError, RuntimeError) as e:  # an unknown model, a size the patch does not divide...
        ap.error(f"--model {args.model!r} with --pe {args.pe!r}: {e}")
    m.train(args.train)
    set_impl(m, rope=args.rope_impl, bias=args.bias_impl)
    x = torch.randn(args.batch, 3, args.img_size, args.img_size, device=args.device)
    mask = None
    if args.pad:
        mask = torch.zeros(args.batch, args.img_size, args.img_size, dtype=torch.bool, device=args.device)
        mask[0, :, -args.pad:] = True
    with quiet_profiler_logs(), torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.bf16), \
            torch.set_grad_enabled(args.train):
        rows = explain(m, x, backward=args.backward and args.train, mask=mask)
    print(f"# {args.model} pe={args.pe} on {args.device}{' bf16' if args.bf16 else ''}, "
          f"{'training' if args.train else 'eval'}, torch {torch.__version__}")
    for r in rows:
        print(f"{r.layer:<20} {r.kernel:<16}" + (f" backward: {', '.join(r.backward)}" if r.backward else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
