"""``make test`` installs what every backend's tests need, so that none of them skips on a machine it set up.

A backend whose packages are optional names its extra in its spec (:data:`harness.backends.BACKENDS`), declared in
``pyproject.toml`` (``openvino``,
``iree``); its tests skip where those packages do not import. ``make test`` installs ``.[dev]``, which
must pull in each such extra (through ``test``), or that backend goes untested there.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from harness.backends import BACKENDS

ROOT = Path(__file__).resolve().parents[2]


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    return extras


def _pulled_in(extra: str, extras: dict[str, list[str]]) -> set[str]:
    """``extra`` and every extra of this project it names (``weightmap[a,b]``), transitively."""
    seen, todo = set(), [extra]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in extras[name]:
            named = re.fullmatch(r"weightmap\[([^\]]+)\]", requirement.split(";")[0].strip())
            if named:
                todo.extend(part.strip() for part in named.group(1).split(","))
    return seen


def test_make_test_installs_every_backends_extra() -> None:
    extras = _extras()
    backends_with_extras = {spec.extra for spec in BACKENDS.values() if spec.extra is not None}
    assert backends_with_extras <= set(extras), "each backend's extra is declared in pyproject.toml"
    assert {"openvino", "iree"} <= backends_with_extras
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "$(PY) -m pip install -q -e '.[dev]'" in makefile, "make test installs the dev extra"
    missing = backends_with_extras - _pulled_in("dev", extras)
    assert not missing, f"make test (the dev extra) does not install the extra of {sorted(missing)}: its tests skip"
