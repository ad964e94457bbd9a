"""The smallest scenario the harness runs (one synthetic layer, two engines, on the CPU), as TOML."""

from __future__ import annotations

from pathlib import Path

TINY_SCENARIO = """
name = "tiny"
strategies = ["map"]
[model]
source = "synthetic"
layers = 1
width = 64
heads = 4
vocab = 64
[checkpoint]
path = "{checkpoint}"
generate = true
[build]
engines = 2
device = "cpu"
"""


def tiny_scenario_text(checkpoint: Path, replace: dict[str, str] | None = None, extra: str = "") -> str:
    """:data:`TINY_SCENARIO` for ``checkpoint``, each ``replace`` key replaced once by its value (the key must
    be there), then ``extra`` (more tables) appended."""
    text = TINY_SCENARIO.format(checkpoint=checkpoint)
    for old, new in (replace or {}).items():
        assert old in text, f"{old!r} is not in the tiny scenario"
        text = text.replace(old, new, 1)
    return text + extra
