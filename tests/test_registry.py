"""Properties every registered encoding must have, whatever its family (issue: one contract)."""
import pytest
import torch

import vispe
from conftest import DIM, attend, build_for_test
from vispe.encoding import FAMILIES, GRID_KEY

GRIDS = [(1, 1), (3, 5), (5, 3), (32, 32)]


def test_registry_lists_names_and_refuses_unknown_ones():
    names = vispe.available()
    for expected in ("none", "sine", "learned_abs", "learned_rowcol", "rope_axial", "rope_mixed", "relbias", "peg"):
        assert expected in names
    with pytest.raises(ValueError, match="unknown encoding 'rope_axail'.*did you mean rope_axial"):
        vispe.build("rope_axail")
    with pytest.raises(ValueError, match="known encodings: .*sine"):
        vispe.build("nope")
    assert set(vispe.available("rotary")) >= {"rope_axial", "rope_mixed"}


def test_duplicate_registration_is_refused():
    from vispe.registry import register

    with pytest.raises(ValueError, match="already registered"):
        register("sine")(type("Other", (vispe.AdditiveEncoding,), {}))


def test_unknown_setting_is_refused_with_the_encoding_name():
    with pytest.raises(ValueError, match="encoding 'sine'.*takes"):
        vispe.build("sine", dim=16, temprature=10)


def test_every_encoding_declares_a_family(encoding_name):
    assert vispe.family_of(encoding_name) in FAMILIES


@pytest.mark.parametrize("grid", GRIDS)
def test_forward_backward_through_attention_without_nan(encoding_name, grid):
    pe = build_for_test(encoding_name, grid=(4, 4), num_prefix_tokens=1)
    P, N = 1, grid[0] * grid[1]
    x = torch.randn(2, P + N, DIM, requires_grad=True)
    out = attend(pe, x, grid, num_prefix_tokens=P)
    assert out.shape == x.shape and torch.isfinite(out).all()
    out.square().mean().backward()
    assert torch.isfinite(x.grad).all()
    for name, p in pe.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


def test_all_padding_rows_and_images_give_no_nan(encoding_name):
    pe = build_for_test(encoding_name, grid=(4, 4))
    shape = (4, 6)
    mask = torch.zeros(3, *shape, dtype=torch.bool)
    mask[0, 2:] = True  # padded bottom rows
    mask[1, :, 3:] = True  # padded right columns
    mask[2] = True  # an image that is all padding
    x = torch.randn(3, 24, DIM, requires_grad=True)
    out = attend(pe, x, shape, mask)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


#: encodings (as built here) whose learned tables are grid-sized: their state_dict records the grid
GRID_RECORDED = {"learned_abs", "learned_rowcol", "relbias", "relpos_decomposed", "liere"}  # liere: the grid its coordinates are built for


def test_state_dict_holds_only_learned_tensors_and_round_trips(encoding_name):
    pe = build_for_test(encoding_name, grid=(4, 4), num_prefix_tokens=1)
    sd = pe.state_dict()
    params = dict(pe.named_parameters())
    record = {GRID_KEY} if encoding_name in GRID_RECORDED else set()
    assert set(sd) == set(params) | record, f"fixed tensors in the state_dict: {set(sd) - set(params)}"
    if record:
        assert sd[GRID_KEY].tolist() == list(pe.table_grid())
    torch.manual_seed(123)
    other = build_for_test(encoding_name, grid=(4, 4), num_prefix_tokens=1)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))
    other.load_state_dict(sd)
    x = torch.randn(1, 1 + 12, DIM)
    torch.manual_seed(0)
    a = attend(pe, x, (3, 4), num_prefix_tokens=1)
    torch.manual_seed(0)
    b = attend(other, x, (3, 4), num_prefix_tokens=1)
    torch.testing.assert_close(a, b)


# float32 math under autocast and batch invariance of every encoding: tests/test_contract*.py (issue 19)


def test_runs_at_a_grid_other_than_its_own(encoding_name):
    pe = build_for_test(encoding_name, grid=(4, 4))
    for shape in [(4, 4), (6, 3), (2, 7)]:
        x = torch.randn(1, shape[0] * shape[1], DIM)
        assert torch.isfinite(attend(pe, x, shape)).all()


# ---------------------------------------------------------------- what a new user types first (issue 41, item 9)
#: the arguments each encoding cannot be built without, as the README's Encodings section states them
REQUIRED = {"axis2d": ["dim"], "comrope": ["head_dim", "num_heads"], "fourier": ["dim"], "irpe": ["num_heads"],
            "learned_abs": ["dim", "grid"], "learned_rowcol": ["dim"], "liere": ["head_dim", "num_heads"],
            "log_cpb": ["num_heads"], "lookhere": ["num_heads"], "none": [], "normidx2d": ["dim"], "peg": ["dim"],
            "relbias": ["num_heads", "grid"], "relbias_axis": ["num_heads"], "relpos_decomposed": ["num_heads", "grid"],
            "rope_axial": ["head_dim", "num_heads"], "rope_mixed": ["head_dim", "num_heads"], "sincos2d": ["dim"],
            "sine": ["dim"], "string": ["head_dim", "num_heads"]}


def test_build_without_a_required_argument_says_what_is_missing_and_what_to_pass():
    from vispe.registry import required_args

    assert {n: required_args(n) for n in vispe.available()} == REQUIRED
    with pytest.raises(ValueError) as e:
        vispe.build("rope_axial", dim=64)
    msg = str(e.value)
    assert "needs head_dim and num_heads" in msg and "dim // num_heads" in msg
    example = msg.split("e.g. ", 1)[1].split(";")[0]  # the call the message suggests works as written
    assert example == "vispe.build('rope_axial', head_dim=8, num_heads=8)"
    assert eval(example, {"vispe": vispe}).head_dim == 8
    with pytest.raises(ValueError, match=r"'relbias' needs grid .*grid=\(14, 14\)"):
        vispe.build("relbias", num_heads=2)
    for name, need in REQUIRED.items():  # every example the error gives builds
        if need:
            with pytest.raises(ValueError) as e:
                vispe.build(name)
            eval(str(e.value).split("e.g. ", 1)[1].split(";")[0], {"vispe": vispe})


def test_python_m_vispe_lists_required_arguments_and_has_help(capsys):
    from vispe.__main__ import main

    def run(*argv):
        rc = main(list(argv))
        out = capsys.readouterr()
        return rc, out.out, out.err

    rc, out, _ = run()
    assert rc == 0 and "``" not in out and "module docstring" not in out
    rows = [r.split("|")[1:-1] for r in out.splitlines()[2:]]
    assert {r[0].strip(): r[3].strip() for r in rows} == {n: ", ".join(a) or "-" for n, a in REQUIRED.items()}
    for flag in ("-h", "--help"):
        rc, out, _ = run(flag)
        assert rc == 0 and "usage: python -m vispe" in out and "explain" in out
    rc, _, err = run("lsit")
    assert rc == 2 and "unknown command 'lsit'" in err


def test_the_docs_state_the_required_arguments():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "encodings.md").read_text()
    assert ("the arguments `vispe.build` requires (`dim` for the additive and conditional encodings, with "
            "`grid` for `learned_abs`; `num_heads` for the bias encodings, with `grid` for `relbias` and "
            "`relpos_decomposed`; `head_dim` and `num_heads` for the rotary ones; none for `none`)") \
        in " ".join(readme.split())
    fam = {n: vispe.family_of(n) for n in REQUIRED}
    for n, need in REQUIRED.items():  # the sentence above, spelt out
        base = {"additive": ["dim"], "conditional": ["dim"], "bias": ["num_heads"], "rotary": ["head_dim", "num_heads"],
                "none": []}[fam[n]]
        assert need == base + (["grid"] if n in ("learned_abs", "relbias", "relpos_decomposed") else []), n
