"""Hand-written notes on a run, kept apart from what is generated and flagged when they may be stale.

Notes live in ``results/<name>.notes.md``, written by people. The generated report
(``<name>.md``) includes them under its own heading. The notes file starts with a stamp,
one HTML comment holding the table's figures as they were when the notes were last
checked against them::

    <!-- notes checked against:
    {"map": {"build-phase host peak": "1.21 GiB", ...},
     "load": {...}} -->

When the figures of a run differ from the stamp (a new run, or a change in how a figure
is derived), the report says which changed, from what to what, above the notes;
``python -m harness plot results/<name> --notes-checked`` stamps the current figures
once the notes have been re-read. Figures are compared as the table prints them, so a
change below the table's precision is not flagged.
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

__all__ = ["Notes", "check_notes", "notes_path", "read_notes", "stamp_notes"]

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


def check_notes(notes: Notes, run: Results) -> list[str]:
    """What changed since the notes were checked: one ``"<strategy> <figure>: <then> → <now>"`` each.

    A notes file never checked gives :data:`NEVER_CHECKED`.
    """
    if notes.checked is None:
        return [NEVER_CHECKED]
    now = _figures(run)
    changes = []
    for name in sorted(set(now) | set(notes.checked), key=lambda n: (n not in now, n)):
        before, after = notes.checked.get(name, {}), now.get(name, {})
        if not before or not after:
            changes.append(f"{name}: {'not in this run' if not after else 'new in this run'}")
            continue
        for figure in after:
            if before.get(figure) != after[figure]:
                changes.append(f"{name} {figure}: {before.get(figure, 'absent')} → {after[figure]}")
    return changes


def stamp_notes(notes: Notes, run: Results) -> Path:
    """Record that ``notes`` were checked against ``run``'s figures (rewrites the file's first line)."""
    figures = _figures(run)
    lines = [f"{json.dumps(name)}: {json.dumps(cells, ensure_ascii=False)}" for name, cells in figures.items()]
    stamp = "{" + ",\n ".join(lines) + "}"
    return write_atomic(notes.path, f"<!-- notes checked against:\n{stamp} -->\n" + notes.text.lstrip("\n"))
