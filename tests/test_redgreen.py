"""Kayhan & van Gemert's red-green data and network (vispe.probes.redgreen)."""
from __future__ import annotations

import pytest
import torch

from vispe.probes import redgreen as RG


def _boxes(img):  # (3, H, W) -> {channel: (top row, left column)}
    out = {}
    for ch in (0, 1):
        ys, xs = torch.nonzero(img[ch], as_tuple=True)
        out[ch] = (int(ys.min()), int(xs.min()))
        assert len(ys) == RG.BOX * RG.BOX  # one whole 4x4 box per colour
    return out


def test_order_is_the_label_and_rows_are_the_place():
    x, y = RG.make_redgreen(40, 0)
    xd, yd = RG.make_redgreen(40, 0, dissimilar=True)
    assert torch.equal(y, torch.arange(40) % 2) and torch.equal(y, yd)
    for img, imgd, c in zip(x, xd, y.tolist()):
        b, bd = _boxes(img), _boxes(imgd)
        red, green = b[0], b[1]
        assert (red[1] < green[1]) == (c == 0)  # class 0: red left of green
        for ch in (0, 1):
            assert RG.ROWS[c] - 4 <= b[ch][0] < RG.ROWS[c] + 4
            assert bd[ch] == (b[ch][0] + (16 if c == 0 else -16), b[ch][1])  # same draw, moved 16 rows


@pytest.mark.parametrize("conv_type, size", [("valid", 2), ("same_zeros", 4), ("full_zeros", 6), ("same_circular", 4)])
def test_net_padding_and_translation(conv_type, size):
    net = RG.RedGreenNet(conv_type)
    x = torch.zeros(1, 3, 32, 32)
    feats = x
    for conv in net.convs:
        feats = conv(feats)
    assert feats.shape[-1] == size
    assert net(torch.rand(2, 3, 32, 32)).shape == (2, 2)
    with pytest.raises(ValueError, match="conv_type"):
        RG.RedGreenNet("reflect")


def test_circular_net_is_invariant_to_circular_shifts_by_its_stride():
    torch.manual_seed(0)
    net = RG.RedGreenNet("same_circular").eval()
    x, _ = RG.make_redgreen(4, 1)
    shifted = torch.roll(x, shifts=8, dims=-2)  # 8 = the total stride: the maps roll by one cell
    torch.testing.assert_close(net(x), net(shifted))
    zeros = RG.RedGreenNet("same_zeros").eval()
    zeros.load_state_dict(net.state_dict())
    assert not torch.allclose(zeros(x), zeros(shifted))  # zero padding: the border tells the place
