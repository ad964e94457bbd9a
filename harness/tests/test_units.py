"""The units of bytes and their formatters are declared once, in :mod:`harness.units`, and every module of the
harness takes them from there: none declares its own, imports one from elsewhere or spells one out (``2**30``,
``1 << 20``, ``>> 20``, ``* 1024``, ``/ 1e6``) in its code (a string, such as a child process's script, is not its
code), and no module of the harness (tests aside) writes a formatter of its own (``_gib``, ``_mb``)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from harness import units
from harness.units import (
    GIB,
    KIB,
    MB,
    MIB,
    PIB,
    TIB,
    format_bytes,
    format_gib,
    format_gib_figure,
    format_mb_per_s,
    format_mib,
    format_size,
    gib_or_mib,
)

HARNESS = Path(__file__).resolve().parents[1]

_UNIT_NAME = re.compile(r"^_?(KIB|MIB|GIB|TIB|PIB|KiB|MiB|GiB|TiB)$")
_SPELLED = {("**", n) for n in ("10", "20", "30", "40", "50")} | {("<<", n) for n in ("10", "20", "30", "40", "50")}
_SHIFTED = {10, 20, 30, 40, 50}
_DECIMAL = {1e6, 1e9}
_FORMATTER = re.compile(r"^_(kib|mib|gib|tib|mb|gb|size|bytes|rate)$", re.IGNORECASE)


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
    return found + _shifted_or_divided(path)


def _shifted_or_divided(path: Path) -> list[str]:
    """Where ``path`` shifts by a unit's bits (``>> 20``) or divides by a decimal unit (``/ 1e6``), in its code or in
    an f-string's expressions; a shift inside a bit mix (an operand of ``^``, as a hash's) is no unit."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mixed = {id(side) for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor)
             for side in (node.left, node.right)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.BinOp) or not isinstance(node.right, ast.Constant) or id(node) in mixed:
            continue
        if isinstance(node.op, ast.RShift) and node.right.value in _SHIFTED:
            found.append(f"{path.relative_to(HARNESS.parent)}:{node.lineno}: shifts by {node.right.value}")
        if isinstance(node.op, ast.Div) and node.right.value in _DECIMAL:
            found.append(f"{path.relative_to(HARNESS.parent)}:{node.lineno}: divides by {node.right.value:g}")
    return found


def _own_formatters(path: Path) -> list[str]:
    """Where ``path`` defines a formatter of a unit of its own (``def _gib(...)``)."""
    return [f"{path.relative_to(HARNESS.parent)}:{node.lineno}: defines {node.name}"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef) and _FORMATTER.match(node.name)]


def _imported_elsewhere(path: Path) -> list[str]:
    """Where ``path`` imports a unit from a module other than :mod:`harness.units` (one that imported it itself)."""
    return [f"{path.relative_to(HARNESS.parent)}:{node.lineno}: {alias.name} from {node.module}"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and node.module != "harness.units"
            for alias in node.names if alias.name in units.__all__]


def test_no_module_declares_or_spells_out_a_unit_of_its_own() -> None:
    problems = [p for path in _modules() for p in [*_problems(path), *_imported_elsewhere(path)]]
    assert problems == [], "take the units from harness.units:\n" + "\n".join(problems)


def test_no_module_writes_a_unit_formatter_of_its_own() -> None:
    problems = [p for path in _modules() if "tests" not in path.parts for p in _own_formatters(path)]
    assert problems == [], "take the formatters from harness.units:\n" + "\n".join(problems)


def test_the_units_are_powers_of_1024() -> None:
    assert (KIB, MIB, GIB, TIB, PIB) == (1024, 1024**2, 1024**3, 1024**4, 1024**5)


@pytest.mark.parametrize(("nbytes", "text"), [(GIB, "1.00 GiB"), (3 * GIB // 2, "1.50 GiB"), (GIB - MIB, "1023 MiB"),
                                              (512 * MIB, "512 MiB"), (0, "0 MiB")])
def test_a_limit_is_written_in_gib_from_one_gib_up_and_in_mib_below(nbytes: int, text: str) -> None:
    assert gib_or_mib(nbytes) == text


def test_the_formatters_write_each_unit_as_the_reports_show_it() -> None:
    assert MB == 10**6
    assert (format_gib(3 * GIB // 2), format_gib(GIB, 3), format_gib(None)) == ("1.50 GiB", "1.000 GiB", "—")
    assert (format_gib_figure(1.5), format_gib_figure(None)) == ("1.5 GiB", "—")
    assert (format_mib(1234 * MIB + MIB // 2), format_mib(-MIB // 100), format_mib(None)) == ("1,234.5 MiB", "0.0 MiB",
                                                                                            "—")
    assert (format_bytes(12), format_bytes(3 * KIB), format_bytes(5 * GIB)) == ("12 bytes", "3.0 KiB", "5.0 GiB")
    assert (format_size(1024), format_size(3 * GIB), format_size(2 * TIB)) == ("1,024 bytes", "3 GiB", "2 TiB")
    assert format_mb_per_s(1_234_567_890) == "1235 MB/s"
    assert gib_or_mib(None) == "?"
