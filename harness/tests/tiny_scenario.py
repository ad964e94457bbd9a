"""The smallest scenario the harness runs (one synthetic layer, two engines, on the CPU), as TOML."""

from __future__ import annotations

import json
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


COMPILED_SCENARIO = """
name = "{name}"
strategies = {strategies}
[model]
source = "synthetic"
layers = 2
width = 256
heads = 4
vocab = 4096
dtype = "float32"
[checkpoint]
path = "{checkpoint}"
generate = true
[build]
engines = {engines}
backend = "{backend}"
{weights}tokens = 8
device = "{device}"
{extra}[run]
cache = "warm"
sample_interval_ms = 10.0
timeout_s = 600
"""


def compiled_scenario(tmp_path: Path, backend: str, *, name: str, engines: int = 2, weights: str | None = None,
                      strategies: tuple[str, ...] = ("map",), device: str = "cpu", extra: str = "") -> Path:
    """Write the smallest model a compiler backend builds (two float32 layers, a warm cache) as
    ``<tmp_path>/<name>.toml`` and return its path; ``weights`` None leaves the backend's default,
    ``extra`` (more of ``[build]`` or more tables) goes before ``[run]``."""
    path = tmp_path / f"{name}.toml"
    path.write_text(COMPILED_SCENARIO.format(
        name=name, strategies=json.dumps(list(strategies)), checkpoint=tmp_path / "tiny.safetensors",
        engines=engines, backend=backend, weights="" if weights is None else f'weights = "{weights}"\n',
        device=device, extra=extra + "\n" if extra else ""), encoding="utf-8")
    return path
