"""What a figure file is called: ``<name>.<kind>.png``, beside ``<name>.md`` and ``results/<name>/``.

Results names (scenario names, ``<scenario>-budget``) are ``[a-z0-9_-]+``
(:data:`harness.results.record.NAME`): they never hold a dot, so the first dot of a figure's
file name ends the name of the results it belongs to. ``<name>-<kind>.png`` could not say
that: ``x-packaged-compiler.png`` would be the compiler figure of ``x-packaged`` and look like
the results of ``x-packaged-compiler``.
"""

from __future__ import annotations

__all__ = ["SEPARATOR", "figure_name"]

SEPARATOR = "."
"""Between a results name and the figure's kind: a character no results name holds."""

_SUFFIX = ".png"


def figure_name(name: str, kind: str) -> str:
    """The file name of figure ``kind`` (``headline``, ``engine-times``, ``wall``...) of the results ``name``."""
    if SEPARATOR in name:
        raise ValueError(f"results name {name!r}: holds {SEPARATOR!r}, which separates it from a figure's kind")
    return f"{name}{SEPARATOR}{kind}{_SUFFIX}"

