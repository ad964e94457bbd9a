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
change below the table's precision is not flagged; nor is a memory figure that did not move
beyond the noise ``harness compare`` holds it to (:attr:`harness.results.comparison.MemoryDelta.flagged`,
with :func:`~harness.results.comparison.figure_noise` of the run rendered); nor are a strategy's time columns when
its wall time did not move beyond the noise by the rule ``harness compare`` marks times with
(:func:`harness.results.spread.time_moved`), applied to the wall time's median and the range
of its rounds as the table prints them. Where either side has one round there is no
interval, and a time whose printed value changed is listed.

Orderings are checked too: where two strategies' median wall times swapped order since the
stamp (even inside the spread), a sentence that names either with an ordering word
("lower", "faster", "above", ...) and a time word is listed as stale (a comparison may
name one side only: "with `b`'s median the lower"). A timing claim no stamp can check
(an ordering of single rounds, "round 9 ... above its median", or of another run, "the run
before this one") is listed every time, whatever changed: such claims belong in the
generated report, where they are derived from the record, or nowhere.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.fileio.atomic import write_atomic
from harness.fileio.files import parse_json, read_text_file
from harness.report.table import strategy_cells
from harness.results import spread
from harness.results.comparison import MemoryDelta, figure_noise
from harness.results.labels import (
    EXCESS,
    EXCESS_SHARE,
    GPU_PREDICTION_ERROR,
    PREDICTED_BUILD_PEAK,
    PREDICTED_GPU_PEAK,
    PREDICTION_ERROR,
)
from harness.results.reading import Results
from harness.results.record import RecordError
from harness.units import GIB

__all__ = ["UNCHECKABLE", "FigureChange", "Notes", "check_notes", "figure_changes", "notes_path", "order_changes",
           "orders_times", "read_notes", "sentences", "stamp_notes", "uncheckable_claims"]

_STAMP = re.compile(r"\A<!-- notes checked against:\s*(?P<figures>.*?) -->\n?", re.S)
_IGNORED = ("strategy", "status", PREDICTED_BUILD_PEAK, PREDICTION_ERROR, PREDICTED_GPU_PEAK, GPU_PREDICTION_ERROR)
"""Columns notes are not checked against: what they say is not measured (a prediction is derived from the rules,
which may change without the run changing)."""
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
_SECONDS = re.compile(r"(\d+(?:\.\d+)?) s\b")
_ORDERING = re.compile(
    r"\b(?:lower|higher|faster|slower|above|below|lowest|highest|fastest|slowest|shorter|longer|quicker|ahead)\b",
    re.I,
)
_UNCHECKABLE = (
    re.compile(r"\brounds?\s+\d", re.I),  # a claim about single rounds
    re.compile(r"\b(?:run|runs) before this one\b|\bprevious run\b|\bearlier run\b", re.I),  # about another run
)
UNCHECKABLE = "a timing claim that no rerun check covers (state it in the generated report or drop it)"
"""How :func:`check_notes` introduces a sentence that orders times no stamp can check."""
_RUNS = re.compile(r"\A(\d+)(?: of \d+)?: (\d+(?:\.\d+)?)–(\d+(?:\.\d+)?) s")
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


def _wall_spread(cells: dict[str, str]) -> spread.MedianSpread | None:
    """The wall time's median (``wall time`` cell) and the range of its finished rounds (``runs`` cell), as the
    table prints them; no interval for one round; ``None`` where the table has no wall time.

    Up to eight rounds the range is the interval :func:`harness.results.spread.median_spread` gives, so this
    check and ``compare`` hold a wall time to the same interval; from nine rounds ``compare``'s lies inside the
    range (order statistics the table does not print), and a time here is held to the range, the wider."""
    median = _seconds(cells)
    if median is None:
        return None
    match = _RUNS.match(cells.get("runs", ""))
    if match is None:
        return spread.MedianSpread(median, None, None, 1, None, None)
    rounds = int(match[1])
    return spread.MedianSpread(median, float(match[2]), float(match[3]), rounds, 1, spread.median_coverage(rounds, 1))


def _times_inside_noise(before: dict[str, str], after: dict[str, str]) -> bool:
    """Whether the wall time did not move beyond the noise (:func:`harness.results.spread.time_moved`, the rule
    ``harness compare`` marks times with): then no time column of the strategy counts as changed."""
    then, now = _wall_spread(before), _wall_spread(after)
    return then is not None and now is not None and spread.time_moved(then, now) is False


_GIB_CELL = re.compile(r"\A([+−-]?\d+(?:\.\d+)?) GiB\Z")
_PERCENT_CELL = re.compile(r"\A([+−-]?\d+(?:\.\d+)?)%\Z")


def _cell_bytes(figure: str, text: str | None, model_bytes: int) -> float | None:
    """A memory cell as bytes, as the table prints it (GiB, or the excess in % of the model); ``None`` for
    any other cell."""
    if text is None:
        return None
    gib = _GIB_CELL.match(text)
    if gib is not None:
        return float(gib[1].replace("−", "-")) * GIB
    percent = _PERCENT_CELL.match(text) if figure == EXCESS_SHARE else None
    return None if percent is None else float(percent[1].replace("−", "-")) / 100 * model_bytes


def _memory_inside_noise(run: Results, strategy: str, figure: str, then: str | None, now: str) -> bool:
    """Whether a memory cell moved no further than the noise ``compare`` holds the figure to (a cell that is not
    memory, or not read as bytes on either side, is not)."""
    if not (_GIB_CELL.match(now) or (figure == EXCESS_SHARE and _PERCENT_CELL.match(now))):
        return False  # not a memory figure: the run is not consulted
    model = run.record.model.bytes
    before, after = _cell_bytes(figure, then, model), _cell_bytes(figure, now, model)
    if before is None or after is None or strategy not in run.metrics:
        return False
    label = EXCESS if figure == EXCESS_SHARE else figure
    delta = MemoryDelta(label, round(before), round(after), model, figure_noise(label, strategy, (run,), model))
    return not delta.flagged


def figure_changes(notes: Notes, run: Results) -> list[FigureChange]:
    """The table's figures that changed since the notes were checked, those that moved inside the noise (the
    rules compare marks figures by) left out."""
    assert notes.checked is not None
    now = _figures(run)
    changes = []
    for name in sorted(set(now) | set(notes.checked), key=lambda n: (n not in now, n)):
        before, after = notes.checked.get(name, {}), now.get(name, {})
        if not before or not after:
            changes.append(FigureChange(name, "", None, None if not after else "new"))
            continue
        noise = _times_inside_noise(before, after)
        for figure in after:
            if before.get(figure) == after[figure] or (noise and figure in _TIME_COLUMNS):
                continue
            if not _memory_inside_noise(run, name, figure, before.get(figure), after[figure]):
                changes.append(FigureChange(name, figure, before.get(figure), after[figure]))
    return changes


def _seconds(cells: dict[str, str]) -> float | None:
    match = _SECONDS.search(cells.get("wall time", ""))
    return float(match[1]) if match else None


def order_changes(notes: Notes, run: Results) -> list[tuple[str, str]]:
    """Pairs of strategies whose median wall times swapped order since the stamp (ties count as no order)."""
    assert notes.checked is not None
    now = _figures(run)
    then_s = {name: _seconds(cells) for name, cells in notes.checked.items()}
    now_s = {name: _seconds(cells) for name, cells in now.items()}
    names = sorted(n for n in set(then_s) & set(now_s) if then_s[n] is not None and now_s[n] is not None)
    swapped = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            before = (then_s[a] or 0) - (then_s[b] or 0)
            after = (now_s[a] or 0) - (now_s[b] or 0)
            if before * after < 0:
                swapped.append((a, b))
    return swapped


def _names(sentence: str, name: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", sentence) is not None


def orders_times(sentence: str) -> bool:
    """Whether a sentence orders times: an ordering word and a time word in one sentence."""
    sentence = re.sub(r"\bno longer\b", "", sentence, flags=re.I)  # "no longer" orders nothing
    return _ORDERING.search(sentence) is not None and re.search(
        r"\b(?:median|medians|interval|wall|time|times|round|rounds|build|s)\b", sentence, re.I) is not None


def uncheckable_claims(text: str) -> list[str]:
    """The notes' sentences that order times of single rounds or of another run: no stamp can check them."""
    return [s for s in sentences(text) if orders_times(s) and any(p.search(s) for p in _UNCHECKABLE)]


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
    swapped = order_changes(notes, run)
    cited: set[FigureChange] = set()
    stale = []
    uncheckable = set(uncheckable_claims(notes.text))
    for sentence in sentences(notes.text):
        if sentence in uncheckable:
            stale.append(f"{UNCHECKABLE}: {sentence}")
            continue
        hits = [c for c in changes if c.then and re.search(rf"(?<![\d.]){re.escape(c.then.lstrip('+−-'))}",
                                                              sentence)]
        reordered = orders_times(sentence) and any(_names(sentence, a) or _names(sentence, b) for a, b in swapped)
        if hits or reordered:
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
