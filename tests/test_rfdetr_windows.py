"""Windows are rectangles of the patch grid, checked from behaviour: change one patch and see which
tokens' outputs move after one window block. And which patches each of transformers 5.23's
``RfDetrDinov2Embeddings.window_partition`` windows holds on an 8 x 16 grid, against vispe's."""
from __future__ import annotations

import pytest
import torch

from vispe.models.detr.vitdet import windows as W
from vispe.models.detr.vitdet.vit import WindowedViT

GRID, N, P = (8, 16), 4, 4  # 8 x 16 patches of 4 pixels, 4 x 4 windows


def _one_block(**kw) -> WindowedViT:
    torch.manual_seed(0)
    return WindowedViT(embed_dim=16, depth=1, num_heads=2, patch_size=P, num_windows=N, window_blocks=[0],
                       out_indices=[1], table_grid=None, **kw).eval()


def _moved(model, x, cell, mask=None) -> torch.Tensor:
    """Which output tokens change when the patch at ``cell`` (y, x) changes.  # (h, w) bool"""
    y = x.clone()
    y[:, :, cell[0] * P:(cell[0] + 1) * P, cell[1] * P:(cell[1] + 1) * P] += 1.0
    with torch.no_grad():
        a, b = model(x, mask)[0][0], model(y, mask)[0][0]
    return ((a - b).abs().amax(1)[0] > 1e-6)  # (h, w)


def _is_rectangle(cells: torch.Tensor, size: tuple[int, int]) -> bool:
    ys, xs = cells.nonzero(as_tuple=True)
    y0, x0 = ys.min().item(), xs.min().item()
    want = torch.zeros_like(cells)
    want[y0:y0 + size[0], x0:x0 + size[1]] = True
    return bool(torch.equal(cells, want))


@pytest.mark.parametrize("cls_token", [False, True])
def test_every_window_is_a_rectangle(cls_token):
    """On 8 x 16 patches with 4 x 4 windows: a change at any patch moves exactly the 2 x 4 rectangle of
    its window, and the 16 rectangles tile the grid."""
    model = _one_block(cls_token=cls_token)
    x = torch.randn(1, 3, GRID[0] * P, GRID[1] * P, generator=torch.Generator().manual_seed(0))
    seen = torch.zeros(GRID, dtype=torch.long)
    for i in range(N):
        for j in range(N):
            cell = (i * 2 + (i + j) % 2, j * 4 + (i * j) % 4)  # some patch inside window (i, j)
            moved = _moved(model, x, cell)
            assert _is_rectangle(moved, (2, 4)), (cell, moved.int())
            assert moved[i * 2, j * 4] and moved[i * 2 + 1, j * 4 + 3]
            seen += moved.long()
    assert torch.equal(seen, torch.ones_like(seen))


def test_windows_on_the_valid_area_are_rectangles():
    """Mask-aware: an image of 4 x 8 valid patches padded to 8 x 16: its windows are the 1 x 2
    rectangles of its valid area, and nothing moves on the padding."""
    model = _one_block(mask_aware=True)
    x = torch.randn(1, 3, GRID[0] * P, GRID[1] * P, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, GRID[0] * P, GRID[1] * P, dtype=torch.bool)
    mask[:, :4 * P, :8 * P] = False
    for cell in [(0, 0), (1, 3), (3, 7), (2, 4)]:
        moved = _moved(model, x, cell, mask)
        assert _is_rectangle(moved, (1, 2)), (cell, moved.int())
        assert moved[cell] and not moved[4:].any() and not moved[:, 8:].any()


def test_grid_not_divisible_is_refused():
    with pytest.raises(ValueError, match=r"grid \(h, w\)=\(8, 14\).*num_windows=4"):
        W.window_shape((8, 14), 4)
    model = _one_block()
    with pytest.raises(ValueError, match="num_windows=4"):
        model(torch.randn(1, 3, 8 * P, 14 * P))
    with pytest.raises(ValueError, match="num_windows=0"):
        W.window_shape((8, 16), 0)


def test_partition_round_trip_and_order():
    x = torch.arange(2 * 8 * 16, dtype=torch.float32).reshape(2, 8, 16, 1)
    t = W.partition(x, 4)  # (2 * 16, 8, 1)
    assert torch.equal(W.unpartition(t, 4, (8, 16)), x)
    idx = x[0, :, :, 0]
    assert torch.equal(t[0 * 16 + 1 * 4 + 2, :, 0], idx[2:4, 8:12].flatten())  # image 0, window (1, 2)


def _holds(windowed: torch.Tensor, prefix: int) -> list[set[tuple[int, int]]]:
    """The patches (y, x) each window holds, from windowed patch indices (windows, tokens, 1)."""
    return [{divmod(int(v), GRID[1]) for v in w[prefix:, 0]} for w in windowed]


def test_transformers_windows_against_vispe():
    """transformers' window_partition on 8 x 16 patches, 4 x 4 windows: window 0 holds rows 0-1 and columns
    0, 1, 8, 9 (not a rectangle); vispe's holds rows 0-1, columns 0-3. Printed: every window of both."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.rf_detr.modeling_rf_detr import RfDetrDinov2Embeddings

    config = transformers.RfDetrDinov2Config(hidden_size=1, num_hidden_layers=1, num_attention_heads=1,
                                             num_windows=N, patch_size=P, image_size=GRID[1] * P,
                                             num_register_tokens=0)
    emb = RfDetrDinov2Embeddings(config)
    tokens = torch.arange(-1, GRID[0] * GRID[1], dtype=torch.float32).reshape(1, -1, 1)  # class token = -1
    theirs = _holds(emb.window_partition(tokens, GRID[0] * P, GRID[1] * P), 1)
    ours = _holds(W.partition(tokens[:, 1:].reshape(1, GRID[0], GRID[1], 1), N), 0)
    assert theirs[0] == {(0, 0), (0, 1), (0, 8), (0, 9), (1, 0), (1, 1), (1, 8), (1, 9)}
    assert ours[0] == {(y, x) for y in range(2) for x in range(4)}
    rect = lambda s: len(s) == (max(y for y, _ in s) - min(y for y, _ in s) + 1) * (  # noqa: E731
        max(x for _, x in s) - min(x for _, x in s) + 1)
    assert all(rect(s) for s in ours)
    assert sum(not rect(s) for s in theirs) == 16  # every one of transformers' windows is scattered
    for k, (a, b) in enumerate(zip(theirs, ours)):
        print(f"window {k}: transformers rows {sorted({y for y, _ in a})} cols {sorted({x for _, x in a})}; "
              f"vispe rows {sorted({y for y, _ in b})} cols {sorted({x for _, x in b})}")
    # on a square grid the two agree window by window (so RF-DETR's square-size parity holds)
    sq = torch.arange(-1, 64, dtype=torch.float32).reshape(1, -1, 1)
    emb_sq = RfDetrDinov2Embeddings(transformers.RfDetrDinov2Config(
        hidden_size=1, num_hidden_layers=1, num_attention_heads=1, num_windows=N, patch_size=P, image_size=8 * P,
        num_register_tokens=0))
    assert torch.equal(emb_sq.window_partition(sq, 8 * P, 8 * P)[:, 1:], W.partition(sq[:, 1:].reshape(1, 8, 8, 1), N))
