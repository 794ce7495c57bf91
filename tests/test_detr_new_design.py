"""A new detector design is one strategy file plus its registration (issue 46): a toy query source,
defined and registered here and nowhere in vispe/, builds, runs the decoder as its contexts say, trains a
step with every parameter moving, and is refused where its registration says (another operator, an
unknown option), with the reason."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from vispe.attention import PosContext
from vispe.models.detr import HungarianMatcher, SetCriterion, create_detr
from vispe.models.detr.design import designs, rules
from vispe.models.detr.mlp import inverse_sigmoid
from vispe.models.detr.queries.base import LayerPositions, QueryPositions, StrategyContext


class GridQueries(QueryPositions):
    """Toy: each query sits at a fixed anchor point on a sqrt(Q) x sqrt(Q)-ish grid (cx, cy); its position
    is the learned embedding plus ``proj(anchor)``; its boxes are offsets from the anchor (not refined)."""

    design = "toy_grid"
    OPTIONS = frozenset({"jitter"})

    def __init__(self, d_model: int, num_queries: int, *, jitter: float = 0.0) -> None:
        super().__init__(d_model)
        if not 0 <= jitter < 0.5:
            raise ValueError(f"decoder_kwargs['jitter']={jitter!r}: expected a number in [0, 0.5)")
        self.proj = nn.Linear(2, d_model)
        side = int(num_queries ** 0.5 + 0.999)
        i = torch.arange(num_queries, dtype=torch.float32)
        self.register_buffer("anchor", torch.stack([(i % side + 0.5) / side, (i // side + 0.5) / side], -1)[None],
                             persistent=False)  # (1, Q, 2) (cx, cy)

    @classmethod
    def build(cls, options: dict, c: StrategyContext) -> GridQueries:
        return cls(c.d_model, c.num_queries, jitter=options.pop("jitter", 0.0))

    def start(self, embed, B, dtype):
        return embed.new_zeros(B, embed.shape[0], self.d_model, dtype=dtype), self.anchor.to(dtype)

    def layer(self, i, t, embed, anchors, memory_ctx) -> LayerPositions:
        ctx = PosContext(pos=(embed[None] + self.proj(anchors)).to(t.dtype))  # (1, Q, d)
        return LayerPositions(ctx, ctx, memory_ctx, anchors)

    def boxes(self, raw, anchors):
        ref = inverse_sigmoid(anchors[0])  # (1, Q, 2)
        return torch.cat([raw[..., :2] + ref, raw[..., 2:]], -1).sigmoid()


SMALL = dict(backbone="small_cnn", backbone_widths=[8, 16], d_model=32, nheads=2, enc_layers=1, dec_layers=2,
             dim_feedforward=32, num_queries=4, dropout=0.0)


@pytest.fixture
def toy():
    designs.register_strategy(GridQueries)  # the whole of the new design's registration
    try:
        yield GridQueries
    finally:
        designs.unregister_strategy("toy_grid")


def _batch():
    g = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 32, 48, generator=g)
    mask = torch.zeros(2, 32, 48, dtype=torch.bool)
    mask[1, :, 32:] = True  # the second image is 32 x 32, padded
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]])},
               {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])}]
    return images, mask, targets


def test_a_registered_strategy_is_what_the_decoder_runs(toy):
    torch.manual_seed(0)
    model = create_detr(3, decoder="toy_grid", **SMALL).eval()
    assert isinstance(model.queries, GridQueries) and model.config["decoder"] == "toy_grid"
    # with proj zeroed its queries' position is DETR's learned one: the same decoder outputs as decoder="detr"
    # with the same weights, and its boxes are those outputs offset by the anchors (in logit space)
    with torch.no_grad():
        model.queries.proj.weight.zero_()
        model.queries.proj.bias.zero_()
    detr = create_detr(3, decoder="detr", **SMALL).eval()
    missing, unexpected = detr.load_state_dict(model.state_dict(), strict=False)
    assert missing == [] and sorted(unexpected) == ["queries.proj.bias", "queries.proj.weight"]
    images, mask, _ = _batch()
    with torch.no_grad():
        ours, theirs = model(images, mask), detr(images, mask)
    torch.testing.assert_close(ours["pred_logits"], theirs["pred_logits"], rtol=0, atol=1e-6)
    want = torch.logit(theirs["pred_boxes"].double())
    want[..., :2] += torch.logit(GridQueries(32, 4).anchor.double())
    torch.testing.assert_close(ours["pred_boxes"].double(), want.sigmoid(), rtol=0, atol=1e-5)
    assert not torch.allclose(ours["pred_boxes"], theirs["pred_boxes"], atol=1e-3)


def test_a_registered_strategy_trains_a_step_with_every_parameter(toy):
    torch.manual_seed(0)
    model = create_detr(3, decoder="toy_grid", decoder_kwargs={"jitter": 0.1}, **SMALL).train()
    criterion = SetCriterion(3, HungarianMatcher())
    images, mask, targets = _batch()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = criterion(model(images, mask), targets)["loss"]
    loss.backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert no_grad == []  # DDP needs every parameter in every step
    opt.step()
    assert [n for n, p in model.named_parameters() if torch.equal(p, before[n])] == []
    with torch.no_grad():
        assert criterion(model(images, mask), targets)["loss"] < loss


def test_a_registered_strategy_is_refused_where_its_registration_says(toy):
    with pytest.raises(ValueError, match=r"decoder='toy_grid' with attention='deformable': it is registered for the "
                                         r"operators \('dense',\)"):
        create_detr(3, decoder="toy_grid", attention="deformable", **SMALL)
    with pytest.raises(ValueError, match=r"decoder_kwargs has \['depth'\] for decoder='toy_grid': expected some of jitter"):
        create_detr(3, decoder="toy_grid", decoder_kwargs={"depth": 2}, **SMALL)
    with pytest.raises(ValueError, match=r"decoder_kwargs\['jitter'\]=0.7: expected a number in \[0, 0.5\)"):
        create_detr(3, decoder="toy_grid", decoder_kwargs={"jitter": 0.7}, **SMALL)
    with pytest.raises(ValueError, match="decoder='toy_grid' is registered already"):
        designs.register_strategy(GridQueries)


def test_registration_is_checked_and_undone():
    with pytest.raises(ValueError, match=r"operators=\('sparse',\): expected some of 'dense', 'deformable'"):
        designs.register_strategy(GridQueries, operators=("sparse",))
    with pytest.raises(ValueError, match="expected a QueryPositions subclass"):
        designs.register_strategy(nn.Linear)
    with pytest.raises(ValueError, match="decoder='dab' is built in"):
        designs.unregister_strategy("dab")
    designs.register_strategy(GridQueries, operators=("dense", "deformable"))
    assert rules.DESIGN_OPERATORS["toy_grid"] == ("dense", "deformable")
    designs.unregister_strategy("toy_grid")
    assert "toy_grid" not in designs.STRATEGIES and "toy_grid" not in rules.DESIGN_OPERATORS
    with pytest.raises(ValueError, match=r"decoder='toy_grid': expected one of 'detr', 'conditional', 'dab'"):
        create_detr(3, decoder="toy_grid", **SMALL)
