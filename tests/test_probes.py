"""Position read-out probes and the padding-leakage experiment (vispe.probes)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torchvision
from scipy.stats import spearmanr
from torch import nn

from vispe.probes import (
    ExperimentConfig,
    ProbeSettings,
    ReadoutProbe,
    build_backbone,
    build_vit_backbone,
    fit_probe,
    flat,
    mae,
    make_inputs,
    parse_vit_spec,
    probe_model,
    spc,
    stack_features,
    swap_padding,
    target_map,
    target_stack,
)
from vispe.probes.backbones import CropResidual, PadPool, spatial_out
from vispe.probes.readout import centre_crop
from vispe.probes.runner import main


# --- targets ----------------------------------------------------------------------------------
def _reference(name: str, h: int, w: int) -> np.ndarray:
    """Independent reference of the Islam et al. maps, pixel by pixel."""
    out = np.zeros((h, w))
    for i in range(h):
        for j in range(w):
            y, x = i / (h - 1), j / (w - 1)
            out[i, j] = {"H": x, "V": y, "HS": (1 + math.cos(4 * math.pi * y)) / 2,
                         "VS": (1 + math.cos(4 * math.pi * x)) / 2,
                         "G": math.exp(-((y - .5) ** 2 + (x - .5) ** 2) / (2 * .25 ** 2))}[name]
    if name == "G":
        out = (out - out.min()) / (out.max() - out.min())
    return out


@pytest.mark.parametrize("shape", [(3, 5), (7, 4), (16, 16)])
@pytest.mark.parametrize("name", ["H", "V", "G", "HS", "VS"])
def test_target_matches_reference_on_non_square_grids(name, shape):
    t = target_map(name, shape)
    assert t.shape == shape and t.dtype == torch.float32
    torch.testing.assert_close(t, torch.tensor(_reference(name, *shape), dtype=torch.float32), atol=1e-6, rtol=0)
    assert t.min() >= 0 and t.max() <= 1 and math.isclose(float(t.max()), 1.0, abs_tol=1e-6)


def test_target_axes_are_pinned():
    h, w = 3, 5
    H, V, HS, VS = (target_map(n, (h, w)) for n in ("H", "V", "HS", "VS"))
    assert torch.equal(H, H[:1].expand(h, w)) and (H[0].diff() > 0).all()  # varies along x only
    assert torch.equal(V, V[:, :1].expand(h, w)) and (V[:, 0].diff() > 0).all()  # along y only
    assert torch.equal(HS, HS[:, :1].expand(h, w))  # horizontal stripes: each row constant
    assert torch.equal(VS, VS[:1].expand(h, w))  # vertical stripes: each column constant
    assert target_stack(("G", "H"), (h, w)).shape == (2, h, w)


def test_target_bf16_matches_float32():
    for name in ("H", "G", "HS"):
        ref = target_map(name, (9, 13))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = target_map(name, (9, 13), dtype=torch.bfloat16)
        assert low.dtype == torch.bfloat16
        torch.testing.assert_close(low.float(), ref, atol=4e-3, rtol=0)


def test_target_bad_input():
    with pytest.raises(ValueError, match="name='X'"):
        target_map("X", (4, 4))
    with pytest.raises(ValueError, match="shape"):
        target_map("H", (0, 4))
    with pytest.raises(ValueError, match="periods"):
        target_map("HS", (4, 4), periods=0)


# --- metrics ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["H", "V", "G", "HS", "VS"])
def test_spc_self_one_and_inverted_minus_one(name):
    t = target_map(name, (6, 9))
    assert float(spc(t, t)[0]) == pytest.approx(1.0, abs=1e-12)
    assert float(spc(1 - t, t)[0]) == pytest.approx(-1.0, abs=1e-12)


def test_spc_flip_is_minus_one():
    H, V = target_map("H", (5, 8)), target_map("V", (5, 8))
    assert float(spc(H.flip(-1), H)[0]) == pytest.approx(-1.0, abs=1e-12)
    assert float(spc(V.flip(-2), V)[0]) == pytest.approx(-1.0, abs=1e-12)


def test_spc_matches_scipy_with_ties_and_mae_matches_numpy():
    g = torch.Generator().manual_seed(0)
    pred = torch.randint(0, 6, (4, 5, 7), generator=g).float()  # many ties
    target = target_map("G", (5, 7))
    ours = spc(pred, target)
    for b in range(4):
        ref = spearmanr(pred[b].flatten().numpy(), target.flatten().numpy()).statistic
        assert float(ours[b]) == pytest.approx(ref, abs=1e-10)
    ref_mae = np.abs(pred.double().numpy() - target.double().numpy()[None]).mean((1, 2))
    np.testing.assert_allclose(mae(pred, target).numpy(), ref_mae, atol=1e-12)


def test_spc_of_flat_prediction_is_zero_even_with_rounding_noise():
    t = target_map("H", (8, 8))
    noisy = 0.5 + 1e-7 * t  # rank-perfect, but a float-rounding-sized spread
    assert bool(flat(noisy)[0]) and float(spc(noisy, t)[0]) == 0.0
    assert float(spc(torch.full((8, 8), 0.3), t)[0]) == 0.0
    assert not bool(flat(0.5 + 1e-2 * t)[0]) and float(spc(0.5 + 1e-2 * t, t)[0]) == pytest.approx(1.0)


def test_metric_bad_input():
    with pytest.raises(ValueError, match="target has shape"):
        spc(torch.zeros(2, 4, 4), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="pred has shape"):
        mae(torch.zeros(4), torch.zeros(4))


# --- backbones and padding swap ---------------------------------------------------------------
@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular", "valid"])
def test_swap_padding_changes_every_conv_of_resnet18(mode):
    net = swap_padding(torchvision.models.resnet18(weights=None), mode)
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 20
    if mode == "valid":
        assert all(c.padding == (0, 0) for c in convs)
        assert net.maxpool.padding == 0
        assert sum(isinstance(m, CropResidual) for m in net.modules()) == 8
    else:
        assert all(c.padding_mode == mode for c in convs)
        assert isinstance(net.maxpool, PadPool if mode != "zeros" else nn.MaxPool2d)


def test_swap_zeros_is_torchvision_and_valid_maps_are_smaller():
    x = torch.rand(1, 3, 64, 64)
    torch.manual_seed(3)
    ref = torchvision.models.resnet18(weights=None).eval()
    ours = build_backbone("resnet18", "zeros", seed=3)
    with torch.no_grad():
        y_ref = ref.layer4(ref.layer3(ref.layer2(ref.layer1(ref.maxpool(ref.relu(ref.bn1(ref.conv1(x))))))))
        maps = ours(x)
    torch.testing.assert_close(maps[-1], y_ref)
    with torch.no_grad():
        valid = build_backbone("resnet18", "valid")(x)
    assert [tuple(m.shape[-2:]) for m in maps] == [(32, 32), (16, 16), (8, 8), (4, 4), (2, 2)]
    assert len(valid) < len(maps)  # stages whose maps would be empty are dropped
    for v, z in zip(valid, maps):
        assert v.shape[-2] < z.shape[-2] and v.shape[-1] < z.shape[-1]


@pytest.mark.parametrize("mode", ["zeros", "reflect", "valid"])
def test_spatial_out_predicts_every_stage_shape(mode):
    for name in ("vgg", "resnet18"):
        model = build_backbone(name, mode)
        x = torch.rand(1, 3, 70, 46)
        hw = (70, 46)
        with torch.no_grad():
            maps = model(x)
        for stage, m in zip(model.stages, maps):
            hw = spatial_out(stage, hw)
            assert tuple(m.shape[-2:]) == hw


@pytest.mark.parametrize("name", ["vgg", "resnet18"])
@pytest.mark.parametrize("mode", ["circular", "reflect", "replicate", "valid"])
def test_constant_input_gives_identical_features_without_zero_padding(name, mode):
    with torch.no_grad():
        maps = build_backbone(name, mode)(torch.full((1, 3, 64, 48), 0.7))
        zeros = build_backbone(name, "zeros")(torch.full((1, 3, 64, 48), 0.7))
    for m in maps:  # every position of every channel holds the same value
        assert torch.equal(m, m[..., :1, :1].expand_as(m))
    assert not torch.equal(zeros[-1], zeros[-1][..., :1, :1].expand_as(zeros[-1]))


def test_backbone_bad_input():
    with pytest.raises(ValueError, match="padding='same'"):
        build_backbone("vgg", "same")
    with pytest.raises(ValueError, match="name='alexnet'"):
        build_backbone("alexnet")
    with pytest.raises(ValueError, match="too small"):
        build_backbone("resnet18", "valid")(torch.rand(1, 3, 6, 6))


# --- read-out probe ---------------------------------------------------------------------------
def test_readout_adds_no_position():
    """The default (valid) read-out is translation-equivariant: shifting the features shifts the
    prediction; a circular one is equivariant to cyclic shifts. Neither knows absolute position."""
    f = torch.rand(1, 4, 9, 11)
    valid = ReadoutProbe(4, 2, kernel_size=3)
    circular = ReadoutProbe(4, 2, kernel_size=3, padding_mode="circular")
    for p in (valid, circular):
        nn.init.normal_(p.conv.weight)
    with torch.no_grad():
        out = valid(f)
        assert out.shape == (1, 2, 7, 9)
        torch.testing.assert_close(valid(f[..., 2:, 3:]), out[..., 2:, 3:])
        torch.testing.assert_close(circular(f.roll((2, 3), (-2, -1))), circular(f).roll((2, 3), (-2, -1)))
    with pytest.raises(ValueError, match="readout_padding='zeros' with kernel_size=1"):
        ProbeSettings(kernel_size=1, readout_padding="zeros")
    crop = centre_crop(torch.arange(20.).reshape(4, 5), (2, 3))
    assert torch.equal(crop, torch.tensor([[6., 7, 8], [11, 12, 13]]))


def test_stack_features_keeps_constant_maps_flat():
    maps = [torch.full((2, 3, 4, 4), 2.0), torch.full((2, 5, 2, 2), -1.5)]
    feats, scales = stack_features(maps, (6, 10))
    assert feats.shape == (2, 8, 6, 10) and scales == pytest.approx([2.0, 1.5])
    assert bool(flat(feats.flatten(0, 1), atol=1e-5).all())
    with pytest.raises(ValueError, match="scales has 1"):
        stack_features(maps, (6, 10), scales=[1.0])


def test_probe_reads_zero_padding_but_not_circular_on_constant_images():
    """Islam et al.'s blank-image test: position from a constant image can only come from borders."""
    cfg = ExperimentConfig(targets=("H", "V"), image_size=32, probe_size=16, n_train=4, n_test=4,
                           probe=ProbeSettings(steps=25))
    zeros = probe_model(build_backbone("vgg", "zeros"), "constant", cfg)[0]
    circular = probe_model(build_backbone("vgg", "circular"), "constant", cfg)[0]
    assert float(zeros.spc[0]) > 0.5 and float(zeros.spc[1]) > 0.5
    assert abs(float(circular.spc[0])) < 0.1 and float(circular.flat[0]) == 1.0
    assert float(zeros.mae[0]) < float(circular.mae[0])


def test_fit_probe_recovers_a_linear_readout():
    """Features that contain the target linearly: the probe finds it (SPC ~1, MAE ~0)."""
    t = target_stack(("H", "G"), (8, 8))
    noise = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    feats = torch.cat([t[None].expand(3, -1, -1, -1), noise], dim=1)  # (3, 5, 8, 8): 2 informative, 3 noise
    probe, losses = fit_probe(feats, t, ProbeSettings(kernel_size=1, steps=50, weight_decay=0.0))
    assert losses[-1] < 1e-4 < losses[0]
    with torch.no_grad():
        pred = probe(feats)
    assert float(mae(pred, t[None].expand_as(pred)).max()) < 0.01
    # errors of 1e-5 break the target's ties (equal columns of H), so SPC stays just below 1
    assert float(spc(pred[:, 0], t[0]).min()) > 0.98 and float(spc(pred[:, 1], t[1]).min()) > 0.98
    with pytest.raises(ValueError, match="kernel_size=5"):
        ProbeSettings(kernel_size=5)


def test_inputs():
    for kind in ("natural", "constant", "noise"):
        x = make_inputs(kind, 3, (20, 30), split="test", seed=1)
        assert x.shape == (3, 3, 20, 30) and x.min() >= 0 and x.max() <= 1
        assert torch.equal(x, make_inputs(kind, 3, (20, 30), split="test", seed=1))
        assert not torch.equal(x, make_inputs(kind, 3, (20, 30), split="train", seed=1))
    c = make_inputs("constant", 2, (5, 6))
    assert torch.equal(c, c[..., :1, :1].expand_as(c))
    with pytest.raises(ValueError, match="kind='photo'"):
        make_inputs("photo", 2)


# --- ViT backbone -----------------------------------------------------------------------------
def test_vit_backbone_maps_per_block():
    model = build_vit_backbone("none", image_size=(32, 64), patch_size=8)
    maps = model(torch.rand(2, 3, 32, 64))
    assert len(maps) == len(model.model.blocks) and maps[0].shape == (2, model.model.embed_dim, 4, 8)
    with torch.no_grad():  # no encoding and a blank image: every token is the same
        blank = build_vit_backbone("peg:circular", image_size=32)(torch.full((1, 3, 32, 32), 0.4))
    assert all(bool(flat(m.flatten(0, 1), atol=1e-5).all()) for m in blank)
    assert parse_vit_spec("peg:zeros") == ("peg", {"padding_mode": "zeros"}, "zeros")
    with pytest.raises(ValueError, match="does not"):
        parse_vit_spec("sine:zeros")


# --- runner -----------------------------------------------------------------------------------
def test_runner_writes_one_row_per_configuration(tmp_path):
    out = tmp_path / "probe.csv"
    df = main(["--backbones", "vgg", "--paddings", "zeros", "circular", "--vits", "none", "--inputs", "constant",
               "noise", "--targets", "H", "G", "--image-size", "32", "--probe-size", "8", "--n-train", "3",
               "--n-test", "3", "--steps", "10", "--threads", "2", "--out", str(out)])
    back = pd.read_csv(out)
    depth = 4  # vit_pico blocks, one probe each
    assert len(back) == len(df) == 2 * 2 * 2 + 1 * 2 * 2 * depth
    key = ["backbone", "encoding", "padding", "input", "target", "level", "seed"]
    assert not back.duplicated(key).any()
    assert back[["spc", "mae", "spc_flat"]].notna().all().all()
    assert set(back["probe_steps"]) == {10} and set(back["backbone_init"]) == {"random"}
    z = back.query("backbone == 'vgg' and padding == 'zeros' and input == 'constant'")
    c = back.query("backbone == 'vgg' and padding == 'circular' and input == 'constant'")
    assert (c["spc"] == 0).all() and (c["spc_flat"] == 1).all() and (z["spc_flat"] == 0).all()


def test_experiment_config_bad_input():
    with pytest.raises(ValueError, match="paddings='same'"):
        ExperimentConfig(paddings=("same",))
    with pytest.raises(ValueError, match="expected at least one backbone"):
        ExperimentConfig(backbones=(), vits=())
    with pytest.raises(ValueError, match="n_test=0"):
        ExperimentConfig(n_test=0)
