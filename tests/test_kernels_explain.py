"""vispe.kernels.explain reports the kernel torch ran, cross-checked with torch's own selection."""
import re

import pytest
import torch
from torch.nn.attention import SDPBackend

from vispe.kernels import set_impl
from vispe.kernels.explain import explain
from vispe.models.explain_cli import main
from vispe.models.vit import create_vit

NAMES = {SDPBackend.FLASH_ATTENTION.value: "flash", SDPBackend.EFFICIENT_ATTENTION.value: "efficient",
         SDPBackend.MATH.value: "math", SDPBackend.CUDNN_ATTENTION.value: "cudnn"}


def _vit(pe):
    torch.manual_seed(0)
    return create_vit("vit_pico", pe=pe, img_size=16, patch_size=4, num_classes=3, depth=2)


def test_kernels_match_torchs_own_choice():
    x = torch.randn(2, 3, 16, 16)
    q = torch.randn(2, 4, 17, 16)
    learned = torch.randn(1, 4, 17, 17, requires_grad=True)
    m = _vit("relbias").eval()
    set_impl(m, bias="reference")
    with torch.no_grad():  # a dense bias without gradient: SDPA's own choice for a constant float mask
        rows = explain(m, x)
        want = NAMES[torch._fused_sdp_choice(q, q, q, attn_mask=learned.detach())]
    assert [r.layer for r in rows] == ["blocks.0.attn", "blocks.1.attn"]
    assert [r.kernel for r in rows] == [want, want]
    set_impl(m, bias="chunked")
    with torch.no_grad():  # the relative kernel: blocks of the bias, each through the fused kernel
        assert [r.kernel for r in explain(m, x)] == ["chunked+flash"] * 2
    m.train()
    set_impl(m, bias="reference")  # a bias with gradient in SDPA: its choice is the math kernel
    want = NAMES[torch._fused_sdp_choice(q, q, q, attn_mask=learned)]
    assert want == "math"
    rows = explain(m, x, backward=True)
    assert [r.kernel for r in rows] == [want, want]
    assert all("SafeSoftmaxBackward0" in r.backward for r in rows)  # math's backward: its decomposition
    set_impl(m, bias="auto")  # vispe's function, whose forward runs the fused kernel
    rows = explain(m, x, backward=True)
    assert [r.kernel for r in rows] == ["chunked+flash"] * 2
    assert all(r.backward == ["BiasedAttentionBackward"] for r in rows)  # 17 tokens: the dense bias
    set_impl(m, bias="chunked")  # the relative kernel (auto's choice from 2 MiB of dense bias on)
    rows = explain(m, x, backward=True)
    assert [r.kernel for r in rows] == ["chunked+flash"] * 2
    assert all(r.backward == ["RelativeBiasAttentionBackward"] for r in rows)
    ctx = create_vit("vit_pico", pe="irpe", pe_kwargs={"contextual": True}, img_size=16, patch_size=4,
                     num_classes=3, depth=2).train()  # a bias of the queries: dense, the chunked backward
    rows = explain(ctx, x, backward=True)
    assert [r.kernel for r in rows] == ["chunked+flash"] * 2
    assert all(r.backward == ["BiasedAttentionBackward"] for r in rows)


def test_rope_layers_stay_on_the_fused_kernel_with_a_padding_mask(capsys):
    m = _vit("rope_mixed").train()
    mask = torch.zeros(2, 16, 16, dtype=torch.bool)
    mask[1, :, 12:] = True
    rows = explain(m, torch.randn(2, 3, 16, 16), backward=True, mask=mask)
    assert [r.kernel for r in rows] == ["flash", "flash"]
    assert all(r.backward == ["ScaledDotProductFlashAttentionForCpuBackward0"] for r in rows)
    main(["--model", "vit_pico", "--pe", "none", "--img-size", "16"])
    out = capsys.readouterr().out
    assert "blocks.0.attn" in out and "flash" in out


def test_a_model_without_attention_layers_is_refused():
    with pytest.raises(ValueError, match="no attention layer"):
        explain(torch.nn.Linear(2, 2), torch.randn(1, 2))


# --- the command line (issue 28, item 9) -----------------------------------------------------------
def test_the_command_names_itself_and_gives_every_option_a_help_and_its_default(capsys):
    with pytest.raises(SystemExit) as e:
        main(["-h"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m vispe explain") and "explain.py" not in out
    for opt, default in (("--model", "vit_cifar"), ("--pe", "relbias"), ("--img-size", "32"), ("--patch-size", "4"),
                         ("--batch", "2"), ("--pad", "0")):
        entry = re.search(rf"\s{opt} [A-Z_]+ ((?:(?! --[a-z]).)*)", " ".join(out.split()))  # up to the next option
        assert entry and entry.group(1).strip() and f"(default: {default})" in entry.group(1), (opt, out)


@pytest.mark.parametrize("argv, words", [
    (["--pe", "rope"], "--pe 'rope': unknown encoding (did you mean rope_axial, rope_mixed"),
    (["--model", "vit_nope", "--pe", "none"], "--model 'vit_nope'"),
    (["--bias-impl", "fast"], "--bias-impl 'fast': expected one of"),
    (["--backward"], "--backward: needs --train"),
    (["--device", "cuda:0"] if not torch.cuda.is_available() else ["--pad", "99"], "--"),
])
def test_a_bad_option_is_a_usage_error_not_a_traceback(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m vispe explain" in err and words in err and "Traceback" not in err, err


def test_python_m_vispe_kernels_explain_still_runs_and_prints_no_profiler_noise():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "vispe.kernels.explain", "--model", "vit_pico", "--pe", "none",
                           "--img-size", "16"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "blocks.0.attn" in proc.stdout
    assert "gpuGetDeviceCount" not in proc.stderr and "USDT" not in proc.stderr, proc.stderr


LAYERS = ("axis", "image", "attention", "models", "train")  # imports go one way, left to right
PLACE = {"vispe/axis": "axis", "vispe/image": "image", "vispe/attention.py": "attention", "vispe/kernels": "attention",
         "vispe/models": "models", "vispe/train": "train"}


def _layer(module: str) -> str | None:
    path = module.replace(".", "/")
    return next((layer for prefix, layer in PLACE.items() if path == prefix.removesuffix(".py")
                 or path.startswith(prefix.removesuffix(".py") + "/")), None)


def test_imports_go_one_way_axis_image_attention_models_train():
    """No module imports a layer above its own, at the top or inside a function (kernels sit with
    attention: ``vispe.kernels.explain``'s command line, which builds a ViT, moved to the models)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    wrong = []
    for prefix, layer in PLACE.items():
        files = [root / prefix] if prefix.endswith(".py") else sorted((root / prefix).rglob("*.py"))
        for f in files:
            for node in ast.walk(ast.parse(f.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
                for name in names:
                    other = _layer(name)
                    if other is not None and LAYERS.index(other) > LAYERS.index(layer):
                        wrong.append(f"{f.relative_to(root)}:{node.lineno} ({layer}) imports {name} ({other})")
    assert not wrong, "\n".join(wrong)


def test_python_m_vispe_dispatches_explain_and_refuses_an_unknown_command(capsys):
    from vispe.__main__ import main as vispe_main

    with pytest.raises(SystemExit) as e:
        vispe_main(["explain", "-h"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: python -m vispe explain")
    assert vispe_main(["explian"]) == 2 and "unknown command 'explian'" in capsys.readouterr().err
    assert vispe_main([]) == 0 and "| rope_axial | rotary |" in capsys.readouterr().out
