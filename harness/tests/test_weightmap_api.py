"""The harness uses weightmap through its public API only (the names of ``weightmap.__all__``), never one of its
modules, so that the library may rearrange its modules without breaking the harness."""

from __future__ import annotations

import ast
from pathlib import Path

import weightmap

HARNESS = Path(__file__).resolve().parents[1]


def _weightmap_imports(path: Path) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` for every name ``path`` imports from weightmap or one of its modules."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "weightmap":
            found += [(node.lineno, node.module or "", a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, "") for a in node.names if a.name.startswith("weightmap.")]
    return found


def test_the_harness_imports_only_public_names_of_weightmap() -> None:
    wrong = [f"{path.relative_to(HARNESS.parent)}:{line}: {module}{'.' + name if name else ''}"
             for path in sorted(HARNESS.rglob("*.py")) for line, module, name in _weightmap_imports(path)
             if module != "weightmap" or name not in weightmap.__all__]
    assert wrong == [], "import these from weightmap's public API (weightmap.__all__):\n" + "\n".join(wrong)
