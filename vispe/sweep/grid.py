"""The grid of a sweep: which train.py runs it holds, their folder names and their overrides.

A grid point is one encoding, one seed and one value of each ``--vary`` key. Each point is one
ordinary train.py run folder ``<sweep_dir>/<point.name>/`` (``train.out_dir=<sweep_dir>``,
``train.run_name=<point.name>``, ``train.compare=[]``, no progress bar), so everything train.py
writes and resumes works unchanged. Points are ordered seed first, then the varied values, then
the encoding, so a sweep stopped half-way has every encoding at the first seeds rather than
some encodings at all.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

#: keys the sweep sets itself for every point; giving them as overrides or --vary is an error
RESERVED = ("model.pe", "train.seed", "train.compare", "train.out_dir", "train.run_name", "train.overwrite")
_SAFE = re.compile(r"[^A-Za-z0-9.+-]+")


@dataclass(frozen=True)
class Point:
    """One grid point: encoding ``pe``, ``seed`` and ``vary`` (``((key, value), ...)`` in --vary order)."""

    pe: str
    seed: int
    vary: tuple = field(default_factory=tuple)
    #: run without the config file's ``model.pe_kwargs`` (they belong to the file's own ``model.pe``)
    drop_pe_kwargs: bool = False

    @property
    def name(self) -> str:
        """Folder name, e.g. ``peg_seed0`` or ``peg+padding_mode-none_seed1`` (a run_name: no slashes)."""
        parts = [self.pe] + [f"{k.rsplit('.', 1)[-1]}-{_SAFE.sub('_', str(v)).strip('_')}" for k, v in self.vary]
        return _SAFE.sub("_", "+".join(parts)) + f"_seed{self.seed}"

    def overrides(self, sweep_dir: Path) -> list[str]:
        """The overrides that make train.py run this point in ``<sweep_dir>/<name>``."""
        return [f"model.pe={self.pe}", *(["model.pe_kwargs={}"] if self.drop_pe_kwargs else []),
                f"train.seed={self.seed}", "train.compare=[]",
                f"train.out_dir={sweep_dir}", f"train.run_name={self.name}", "train.progress=false",
                *(f"{k}={v}" for k, v in self.vary)]


def split_list(arg: str, what: str) -> list[str]:
    """``"a,b, c"`` -> ``["a", "b", "c"]``, commas inside ``[...]`` / ``{...}`` kept (``"[1,2],{a: 1, b: 2}"``
    is two items); an empty item or list, or unbalanced brackets, is a ValueError naming ``what``."""
    items, depth, cur = [], 0, ""
    for ch in str(arg):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(ch, 0)
        if depth < 0:
            break
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise ValueError(f"{what}={arg!r}: unbalanced brackets")
    items = [s.strip() for s in items + [cur]]
    if not items or any(not s for s in items):
        raise ValueError(f"{what}={arg!r}: expected a comma-separated list of non-empty items, e.g. a,b")
    return items


def parse_seeds(arg: str) -> list[int]:
    out = []
    for s in split_list(arg, "--seeds"):
        try:
            out.append(int(s))
        except ValueError:
            raise ValueError(f"--seeds={arg!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if len(set(out)) != len(out):
        raise ValueError(f"--seeds={arg!r}: expected each seed once")
    return out


def parse_vary(items: list[str]) -> list[tuple[str, list[str]]]:
    """``["model.pe_kwargs.padding_mode=zeros,none"]`` -> ``[("model.pe_kwargs.padding_mode", ["zeros", "none"])]``."""
    out = []
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--vary {item!r}: expected key=value1,value2 (e.g. model.pe_kwargs.padding_mode=zeros,none)")
        check_key_free(key, "--vary")
        if key in (k for k, _ in out):
            raise ValueError(f"--vary {item!r}: key {key!r} is varied twice")
        out.append((key, split_list(values, f"--vary {key}")))
    return out


def check_key_free(key: str, where: str) -> None:
    if key in RESERVED:
        raise ValueError(f"{where} sets {key!r}, which the sweep sets for each point "
                         f"(use --pe for model.pe, --seeds for train.seed, --out for the folder)")


def check_overrides(overrides: list[str]) -> None:
    for o in overrides:
        key, sep, _ = o.partition("=")
        if not sep:
            raise ValueError(f"override {o!r}: expected key=value, e.g. train.epochs=3")
        check_key_free(key, f"override {o!r}")


def sets_pe_kwargs(overrides: list[str], vary: list[tuple[str, list[str]]] = ()) -> bool:
    """Whether the sweep's command line sets ``model.pe_kwargs`` (whole or one key), in an override or
    a ``--vary`` axis: then the settings apply to every point (and a point that cannot take them is
    refused); otherwise the config file's settings follow the file's own encoding (``expand``)."""
    keys = [o.partition("=")[0].strip() for o in overrides] + [k for k, _ in vary]
    return any(k == "model.pe_kwargs" or k.startswith("model.pe_kwargs.") for k in keys)


def expand(pes: list[str], seeds: list[int], vary: list[tuple[str, list[str]]] = (),
           settings_of: str | None = None) -> list[Point]:
    """Every grid point, seed-major; duplicate encodings are dropped (first kept). ``settings_of``:
    the encoding that the config file's ``model.pe_kwargs`` belong to (its ``model.pe``); points of
    any other encoding run without them, as ``train.compare``'s baselines do (None: keep them all)."""
    if len(set(pes)) != len(pes):
        pes = list(dict.fromkeys(pes))
    combos = list(itertools.product(*[[(k, v) for v in values] for k, values in vary]))
    points = [Point(pe, seed, tuple(combo), settings_of is not None and pe != settings_of)
              for seed in seeds for combo in combos for pe in pes]
    names = [p.name for p in points]
    if len(set(names)) != len(names):  # e.g. values differing only by characters replaced in the name
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"--vary values give the same run folder name twice ({', '.join(dup)}): "
                         "use values that differ in letters, digits, '.', '+' or '-'")
    return points
