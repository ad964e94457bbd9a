"""The binary units of bytes are declared once, in :mod:`harness.units`, and every module of the harness takes them
from there: none declares its own, imports one from elsewhere or spells one out (``2**30``, ``1 << 20``, ``* 1024``)
in its code (a string, such as a child process's script, is not its code)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from harness import units
from harness.units import GIB, KIB, MIB, PIB, TIB, gib_or_mib

HARNESS = Path(__file__).resolve().parents[1]

_UNIT_NAME = re.compile(r"^_?(KIB|MIB|GIB|TIB|PIB|KiB|MiB|GiB|TiB)$")
_SPELLED = {("**", n) for n in ("10", "20", "30", "40", "50")} | {("<<", n) for n in ("10", "20", "30", "40", "50")}


def _modules() -> list[Path]:
    return sorted(p for p in HARNESS.rglob("*.py") if p.name != "units.py")


def _problems(path: Path) -> list[str]:
    """Where ``path`` declares a unit of its own (``GIB = ...``) or spells one in code (strings are not code)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
              if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)]
    found = []
    for i, t in enumerate(tokens[:-2]):
        after = tokens[i + 1]
        if t.type == tokenize.NAME and _UNIT_NAME.match(t.string) and after.string == "=" and t.start[1] == 0:
            found.append(f"{path.relative_to(HARNESS.parent)}:{t.start[0]}: declares {t.string}")
        if t.type == tokenize.NUMBER and (after.string, tokens[i + 2].string) in _SPELLED and (
                t.string == "2" or after.string == "<<"):
            found.append(f"{path.relative_to(HARNESS.parent)}:{t.start[0]}: spells out "
                         f"{t.string} {after.string} {tokens[i + 2].string}")
        if t.string == "*" and after.type == tokenize.NUMBER and after.string == "1024":
            found.append(f"{path.relative_to(HARNESS.parent)}:{t.start[0]}: spells out * 1024")
    return found


def _imported_elsewhere(path: Path) -> list[str]:
    """Where ``path`` imports a unit from a module other than :mod:`harness.units` (one that imported it itself)."""
    return [f"{path.relative_to(HARNESS.parent)}:{node.lineno}: {alias.name} from {node.module}"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and node.module != "harness.units"
            for alias in node.names if alias.name in units.__all__]


def test_no_module_declares_or_spells_out_a_unit_of_its_own() -> None:
    problems = [p for path in _modules() for p in [*_problems(path), *_imported_elsewhere(path)]]
    assert problems == [], "take the units from harness.units:\n" + "\n".join(problems)


def test_the_units_are_powers_of_1024() -> None:
    assert (KIB, MIB, GIB, TIB, PIB) == (1024, 1024**2, 1024**3, 1024**4, 1024**5)


@pytest.mark.parametrize(("nbytes", "text"), [(GIB, "1.00 GiB"), (3 * GIB // 2, "1.50 GiB"), (GIB - MIB, "1023 MiB"),
                                              (512 * MIB, "512 MiB"), (0, "0 MiB")])
def test_a_limit_is_written_in_gib_from_one_gib_up_and_in_mib_below(nbytes: int, text: str) -> None:
    assert gib_or_mib(nbytes) == text
