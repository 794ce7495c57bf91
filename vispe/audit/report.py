"""What an audit says: where position enters, what each probe found, and the defects.

``Report.text()`` is plain text for a terminal, ``Report.markdown()`` a Markdown section; both list
the same lines. A ``Defect`` is a finding that breaks a model (its evidence: the numbers a probe
measured; its fix: the vispe call or setting that removes it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

#: the kinds of defect a probe reports
KINDS = ("sizes", "table", "rotary", "relative", "windows", "padding", "dtype")


@dataclass
class Entry:
    """A place where position enters the model."""

    where: str  # module name ("" = the model's input), or a short description
    family: str  # additive | additive-at-attention | rotary | bias | conditional | windowed | none
    details: list[str] = field(default_factory=list)  # conventions found, one line each


@dataclass
class Finding:
    topic: str  # sizes | table | rotary | relative | windows | padding | dtype
    text: str
    evidence: str = ""


@dataclass
class Defect:
    kind: str  # one of KINDS
    text: str
    evidence: str
    fix: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r}: expected one of {', '.join(KINDS)}")


@dataclass
class Report:
    model: str  # the model's class (and the spec it came from)
    native: tuple[int, int]  # pixels (H, W)
    patch: tuple[int, int]
    entries: list[Entry] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    defects: list[Defect] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def families(self) -> list[str]:
        """The families of the places where position enters, in order, without repeats."""
        return list(dict.fromkeys(e.family for e in self.entries)) or ["none"]

    @property
    def family(self) -> str:
        return "+".join(self.families)

    def _lines(self, timing: bool = True) -> tuple[str, list[str], list[str], list[str]]:
        head = (f"{self.model}: position {self.family}; native {self.native[0]}x{self.native[1]} px, "
                f"patch {self.patch[0]}x{self.patch[1]}; {len(self.defects)} defect(s)")
        head += f"; {self.seconds:.1f} s" if timing else ""
        where = [f"{e.where or 'input'}: {e.family}" + "".join(f"\n    {d}" for d in e.details) for e in self.entries]
        found = [f"[{f.topic}] {f.text}" + (f" ({f.evidence})" if f.evidence else "") for f in self.findings]
        bad = [f"[{d.kind}] {d.text}\n    evidence: {d.evidence}\n    fix: {d.fix}" for d in self.defects]
        return head, where or ["no position found"], found, bad or ["none"]

    def text(self, timing: bool = True) -> str:
        """Plain text; ``timing=False`` leaves out the seconds the audit took (for a stable record)."""
        head, where, found, bad = self._lines(timing)
        return "\n".join([head, "where position enters:", *(f"  {w}" for w in where), "findings:",
                          *(f"  {f}" for f in found), "defects:", *(f"  {b}" for b in bad)])

    def markdown(self, timing: bool = True) -> str:
        head, where, found, bad = self._lines(timing)

        def items(lines: list[str]) -> list[str]:
            return ["- " + ln.replace("\n    ", "\n    - ") for ln in lines]  # details as nested items

        return "\n".join([f"**{head}**", "", "Where position enters:", "", *items(where), "", "Findings:", "",
                          *items(found), "", "Defects:", "", *items(bad)])

    def __str__(self) -> str:
        return self.text()
