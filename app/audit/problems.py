"""What ``cstp audit verify`` reports: one ``Problem`` per finding (app.audit.verify, and
app.audit.checkpoints for a checkpoint that does not match the chain), gathered in a
``Report``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Problem:
    kind: str
    seq: int | None  # the entry (first of a range), or where an inserted row belongs
    table: str | None
    row_id: str | None
    detail: str
    last: int | None = None  # the last entry of a range

    def line(self) -> str:
        where = "seq -" if self.seq is None else f"seq {self.seq}"
        if self.last is not None and self.last != self.seq:
            where += f"..{self.last}"
        if self.kind == "inserted" and self.seq is not None:
            where = f"after seq {self.seq}"
        row = f" {self.table} {self.row_id}" if self.table else ""
        return f"{where}{row}: {self.kind}: {self.detail}"


@dataclass
class Report:
    first: int  # the first entry checked
    last: int  # the chain's last entry (0: empty)
    checked: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems
