"""Hand-written notes on a run, kept apart from what is generated and flagged when they may be stale.

Notes live in ``results/<name>.notes.md``, written by people. The generated report
(``<name>.md``) includes them under its own heading. The notes file starts with a stamp,
one HTML comment holding the table's figures as they were when the notes were last
checked against them::

    <!-- notes checked against:
    {"map": {"build-phase host peak": "1.21 GiB", ...},
     "load": {...}} -->

When the figures of a run differ from the stamp (a new run, or a change in how a figure
is derived), the report flags the notes above them and lists, each once on its own line,
the sentences of the notes that cite a figure as it was (its old value, as the table
printed it), then how many other figures changed;
``python -m harness plot results/<name> --notes-checked`` stamps the current figures
once the notes have been re-read. Figures are compared as the table prints them, so a
change below the table's precision is not flagged; nor is a time that moved inside the
run-to-run spread (a strategy's time columns, when its old and new ranges of wall times
over the rounds overlap).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.report.table import strategy_cells
from harness.results.atomic import write_atomic
from harness.results.reading import Results
from harness.results.record import RecordError, parse_json, read_text_file

__all__ = ["FigureChange", "Notes", "check_notes", "figure_changes", "notes_path", "read_notes", "sentences",
           "stamp_notes"]

_STAMP = re.compile(r"\A<!-- notes checked against:\s*(?P<figures>.*?) -->\n?", re.S)
_IGNORED = ("strategy", "status")
NEVER_CHECKED = "never checked against any figures"
"""What :func:`check_notes` says of notes without a stamp."""
OLD_MARKER = "<!-- notes: kept when this file is regenerated -->"
"""Where reports written before notes had a file of their own kept them."""


def notes_path(report: Path) -> Path:
    """``<name>.notes.md`` beside the report ``<name>.md``."""
    return report.with_name(report.name.removesuffix(".md") + ".notes.md")


@dataclass(frozen=True)
class Notes:
    """A notes file: its text (without the stamp) and the figures it was last checked against."""

    path: Path
    text: str
    checked: dict[str, dict[str, str]] | None


def _figures(run: Results) -> dict[str, dict[str, str]]:
    return {name: {k: v for k, v in cells.items() if k not in _IGNORED} for name, cells in strategy_cells(run).items()}


def read_notes(path: Path) -> Notes | None:
    """The notes at ``path``; ``None`` when there is no such file."""
    text = read_text_file(path)
    if text is None:
        return None
    match = _STAMP.match(text)
    if match is None:
        return Notes(path, text, None)
    fix = "fix it or delete the line and re-check the notes"
    try:
        checked = parse_json(match["figures"], "")
    except RecordError as exc:
        raise HarnessError(f"{path}: the stamp on its first line is {str(exc).removeprefix(': ')}; {fix}") from exc
    if not isinstance(checked, dict) or not all(
        isinstance(cells, dict) and all(isinstance(v, str) for v in cells.values()) for cells in checked.values()
    ):
        raise HarnessError(f"{path}: the stamp on its first line is not an object of strategies' figures; {fix}")
    return Notes(path, text[match.end():], checked)


def migrate_notes(report: Path) -> Notes | None:
    """Move notes kept at the end of a report of the old layout into their own file (unstamped)."""
    path = notes_path(report)
    if os.path.lexists(path):
        return read_notes(path)
    text = read_text_file(report)
    if text is None:
        return None
    at = text.find(OLD_MARKER)
    tail = text[at + len(OLD_MARKER):].strip("\n") if at >= 0 else ""
    tail = re.sub(r"\A## Notes\n+", "", tail)  # the report gives the notes their heading
    if not tail.strip():
        return None
    write_atomic(path, tail + "\n")
    return read_notes(path)


_TIME_COLUMNS = frozenset({"load time", "build time", "wall time", "runs"})
_RANGE = re.compile(r"(\d+(?:\.\d+)?)–(\d+(?:\.\d+)?) s")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*`(\[])|\n\s*\n|\n(?=\s*[-*] )")


@dataclass(frozen=True)
class FigureChange:
    """One figure of the table that differs from the stamp, as the table prints it (``None``: absent)."""

    strategy: str
    figure: str
    then: str | None
    now: str | None

    def __str__(self) -> str:
        if self.figure == "":
            return f"{self.strategy}: {'not in this run' if self.now is None else 'new in this run'}"
        return f"{self.strategy} {self.figure}: {self.then or 'absent'} → {self.now or 'absent'}"


def _wall_range(cells: dict[str, str]) -> tuple[float, float] | None:
    """The range of wall times over the rounds, as the ``runs`` cell prints it (None for one run)."""
    match = _RANGE.search(cells.get("runs", ""))
    return (float(match[1]), float(match[2])) if match else None


def _inside_spread(before: dict[str, str], after: dict[str, str]) -> bool:
    """Whether the old and new rounds' wall times overlap: a time that moved within them is noise."""
    old, new = _wall_range(before), _wall_range(after)
    return old is not None and new is not None and old[0] <= new[1] and new[0] <= old[1]


def figure_changes(notes: Notes, run: Results) -> list[FigureChange]:
    """The table's figures that changed since the notes were checked, times inside the spread left out."""
    assert notes.checked is not None
    now = _figures(run)
    changes = []
    for name in sorted(set(now) | set(notes.checked), key=lambda n: (n not in now, n)):
        before, after = notes.checked.get(name, {}), now.get(name, {})
        if not before or not after:
            changes.append(FigureChange(name, "", None, None if not after else "new"))
            continue
        noise = _inside_spread(before, after)
        for figure in after:
            if before.get(figure) != after[figure] and not (noise and figure in _TIME_COLUMNS):
                changes.append(FigureChange(name, figure, before.get(figure), after[figure]))
    return changes


def sentences(text: str) -> list[str]:
    """The notes' sentences and list items, each on one line (tables and the stamp are not prose)."""
    prose = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("|"))
    return [" ".join(s.split()) for s in _SENTENCE_END.split(prose) if s.strip()]


def check_notes(notes: Notes, run: Results) -> list[str]:
    """What makes the notes stale: each sentence that cites a changed figure's old value, once, then one line
    on the changed figures no sentence cites (``"<n> other figures changed: <strategy> <figure>: <then> →
    <now>; ..."``). Empty when nothing changed; a notes file never checked gives :data:`NEVER_CHECKED`.
    """
    if notes.checked is None:
        return [NEVER_CHECKED]
    changes = figure_changes(notes, run)
    cited: set[FigureChange] = set()
    stale = []
    for sentence in sentences(notes.text):
        hits = [c for c in changes if c.then and re.search(rf"(?<![\d.]){re.escape(c.then.lstrip('+−-'))}",
                                                              sentence)]
        if hits:
            stale.append(sentence)
            cited.update(hits)
    others = [c for c in changes if c not in cited]
    if others:
        stale.append(f"{len(others)} other figure{'s' if len(others) > 1 else ''} changed: "
                     + "; ".join(map(str, others)))
    return stale


def stamp_notes(notes: Notes, run: Results) -> Path:
    """Record that ``notes`` were checked against ``run``'s figures (rewrites the file's first line)."""
    figures = _figures(run)
    lines = [f"{json.dumps(name)}: {json.dumps(cells, ensure_ascii=False)}" for name, cells in figures.items()]
    stamp = "{" + ",\n ".join(lines) + "}"
    return write_atomic(notes.path, f"<!-- notes checked against:\n{stamp} -->\n" + notes.text.lstrip("\n"))
