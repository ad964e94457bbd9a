"""The run directories the reading tests go through: every committed result under ``results/``, and the
records of older layouts kept under ``harness/tests/old_layouts`` once their scenarios were rerun (its
README says which, and from where)."""

from __future__ import annotations

from pathlib import Path

from harness.results.record import SUMMARY

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted(p.parent for p in (ROOT / "results").glob(f"*/{SUMMARY}"))
OLD_LAYOUTS = sorted(p.parent for p in (Path(__file__).parent / "old_layouts").glob(f"*/{SUMMARY}"))
RECORDED = COMMITTED + OLD_LAYOUTS


def run_id(directory: Path) -> str:
    """A test id naming where the run is kept: ``results/pi05`` or ``old_layouts/pi05-trim``."""
    return f"{directory.parent.name}/{directory.name}"
