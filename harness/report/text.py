"""How every report writes its numbers and its context, shared by the table and the figures.

Bytes are shown in GiB (2^30 bytes) with :func:`gib_decimals` decimals, fractions of the
model as signed percentages, missing values as a dash; the provenance line every figure
carries and the machine description come from here too, so the table and the figures
always print a figure the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from harness.results.metrics import StrategyMetrics
from harness.results.reading import Results
from harness.results.record import ModelInfo
from harness.units import DASH, GIB, format_bytes, format_gib

__all__ = [
    "TableColumn",
    "card_text",
    "cell",
    "commit_text",
    "footer_text",
    "format_percent",
    "format_seconds",
    "gib_decimals",
    "machine_text",
    "markdown_table",
    "model_text",
    "phases_text",
    "release_sentence",
    "run_subject",
    "short_commit",
    "shorten",
    "status_text",
    "versions_text",
]

def gib_decimals(model_bytes: int) -> int:
    """Decimals for GiB figures: 2 for models of 1 GiB or more, 3 below (so small runs stay readable)."""
    return 2 if model_bytes >= GIB else 3


def format_percent(fraction: float | None) -> str:
    """A signed percentage (``+1.2%``, ``−0.4%``); ``None`` as a dash."""
    if fraction is None:
        return DASH
    return f"{fraction * 100:+.1f}%".replace("-", "−")


def format_seconds(value: float | None) -> str:
    """``12.3 s``; ``None`` as a dash."""
    return DASH if value is None else f"{value:.1f} s"


def cell(text: str) -> str:
    """``text`` made safe inside a markdown table cell (one line, pipes escaped)."""
    return " ".join(text.split()).replace("|", "\\|")


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def status_text(strategy: StrategyMetrics, limit: int | None = None) -> str:
    """``ok``, or ``FAILED: <reason>`` (shortened to ``limit`` characters when given)."""
    if strategy.record.ok:
        return strategy.record.status
    reason = strategy.record.error or "no reason recorded"
    if limit is not None:
        reason = shorten(reason, limit)
    return f"FAILED: {reason}" if strategy.record.status == "failed" else f"{strategy.record.status}: {reason}"


def short_commit(commit: str | None, length: int = 12) -> str:
    """``commit`` cut to ``length`` hex digits, keeping a ``-dirty`` suffix; "not recorded" when None."""
    if not commit:
        return "not recorded"
    sha, dirty, _ = commit.partition("-dirty")
    return sha[:length] + ("-dirty" if dirty else "")


def commit_text(commit: str | None, length: int = 10) -> str:
    """``commit 0123456789``, or ``commit 0123456789 with uncommitted changes`` for a record made from a tree
    with changes not committed (its ``-dirty`` suffix), said in words; ``commit not recorded`` when None."""
    if not commit:
        return "commit not recorded"
    sha, dirty, _ = commit.partition("-dirty")
    return f"commit {sha[:length]}" + (" with uncommitted changes" if dirty else "")


_TRIMMED = re.compile(r"^(?P<stem>.+)-trim(?P<count>\d+)-[0-9a-f]{8}$")
"""A trimmed model's name (:meth:`harness.scenario.ModelConfig.name`): its stem, the count, a digest of the names."""


def model_text(model: ModelInfo) -> str:
    """The model as a title names it, from its record: its name, where it came from (``pi05 from lerobot 0.6.1``,
    ``pi05 from its weight spec``; a synthetic model's name says it all), and a trimmed model's tensors in words
    rather than the digest its name ends with (``pi05 less 2 trimmed tensors``)."""
    trimmed = _TRIMMED.match(model.name)
    name = model.name
    if trimmed:
        count = int(trimmed["count"])
        name = f"{trimmed['stem']} less {count} trimmed tensor{'s' if count != 1 else ''}"
    if model.source.startswith("spec:"):
        return f"{name} from its weight spec"
    if model.source and model.source != "synthetic":
        return f"{name} from {model.source}"
    return name


def card_text(run: Results) -> str:
    """``, on NVIDIA H100 80GB HBM3``: the GPU the run measured, from its record, for a title; empty without
    one (a run's name may name another card than the one it ran on)."""
    gpu = run.record.machine.gpu
    if not gpu or not run.gpu_measured:
        return ""
    return f", on {gpu}"


def run_subject(run: Results) -> str:
    """What a figure's title says the run measured: the model (:func:`model_text`) and the GPU (:func:`card_text`)."""
    return model_text(run.record.model) + card_text(run)


def versions_text(run: Results) -> str:
    """``python 3.11.7, torch 2.13.0, ...``: the versions that were installed."""
    return ", ".join(f"{k} {v}" for k, v in run.record.versions.items() if v)


def machine_text(run: Results) -> str:
    """``16 CPUs, 128 GiB memory, NVIDIA H200`` (or ``no GPU``)."""
    m = run.record.machine
    parts = []
    if m.cpus is not None:
        parts.append(f"{m.cpus} CPUs")
    if m.mem_total_bytes:
        parts.append(f"{format_gib(m.mem_total_bytes, 0)} memory")
    parts.append(m.gpu or "no GPU")
    return ", ".join(parts)


def footer_text(run: Results) -> str:
    """Provenance: machine, backend, device, cache, versions, commit, date (wrapped when drawn)."""
    record = run.record
    parts = [
        f"machine: {machine_text(run)}",
        f"backend {record.backend}, device {record.device}, cache {record.cache or 'unknown'}",
        versions_text(run),
        commit_text(record.commit, 10),
        f"created {record.created or 'unknown'}",
    ]
    return "   |   ".join(p for p in parts if p)


Row = TypeVar("Row")


@dataclass(frozen=True)
class TableColumn(Generic[Row]):
    """A markdown table's column: its header and its cell of a row; numbers align right, text left."""

    header: str
    value: Callable[[Row], str]
    text: bool = False


def markdown_table(columns: Sequence[TableColumn[Row]], rows: Iterable[Row]) -> list[str]:
    """The markdown lines of a table with ``columns``, a line per row, each cell made safe (:func:`cell`)."""
    lines = ["| " + " | ".join(c.header for c in columns) + " |",
             "| " + " | ".join("---" if c.text else "---:" for c in columns) + " |"]
    return lines + ["| " + " | ".join(cell(c.value(row)) for c in columns) + " |" for row in rows]


def release_sentence(s: StrategyMetrics, with_buffers_bytes: int) -> str | None:
    """One sentence on what the strategy released after each weight's last engine and what it kept, from its
    figures: each weight counts once however many engines read it, so released is at most the model. What is
    kept beyond the checkpoint's weights (non-persistent buffers, ``with_buffers_bytes`` less the model's) is
    named as such; the strategy's own note explains any weight kept; weights of the checkpoint that no engine
    reads (and so no plan releases or keeps) are named last."""
    released, kept, share = s.record.released_bytes, s.record.unreleased_bytes, s.released_share
    if released is None or kept is None or share is None:
        return None
    d = gib_decimals(s.model_bytes)
    buffers = max(0, with_buffers_bytes - s.model_bytes)
    note = s.record.release_note.rstrip(".")
    if released >= s.model_bytes:
        text = f"released every weight of the checkpoint ({format_gib(released, d)}) after its last engine"
        if kept:
            what = "non-persistent buffers, which the checkpoint does not hold" if kept <= buffers else note
            text += f"; kept {format_bytes(kept)}: {what}"
        return text
    def amount(value: int) -> str:
        return format_gib(value, d) if value >= GIB / 10**d else format_bytes(value)

    if released <= buffers:  # at most the non-persistent buffers: no weight of the checkpoint
        text = f"released no weight of the checkpoint ({amount(kept)} kept): {note}"
    else:
        text = (f"released {amount(released)} ({share * 100:.1f}% of the model) after the last engine of each; "
                f"kept {amount(kept)}: {note}")
    unread = with_buffers_bytes - released - kept
    if unread > buffers:
        text += (f"; {amount(unread)} of the checkpoint belongs to no engine (weights the built model never "
                 "reads), neither released nor kept by the plan")
    return text


def phases_text(s: StrategyMetrics, then: str = "; ") -> str:
    """The wall's phases, which add up to it: ``load 1.2 s + export 3.4 s + build 5.6 s (+ 0.1 s between)``,
    and, after ``then``, the check against eager after it where recorded."""
    parts = [f"load {format_seconds(s.load_s)}"]
    if s.export_s is not None:
        parts.append(f"export {format_seconds(s.export_s)}")
    parts.append(f"build {format_seconds(s.build_s)}")
    text = " + ".join(parts)
    if s.between_s is not None and s.between_s >= 0.05:
        text += f" + {format_seconds(s.between_s)} between them"
    if s.check_s is not None:
        text += f"{then}then the check against eager {format_seconds(s.check_s)}, outside the wall"
    return text
