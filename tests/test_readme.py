"""Every Python block of the README runs as written.

A block is a fenced ```python block; each runs in a fresh namespace, in a temporary
working directory. Illustrations that cannot run as written belong in ```text or
```sh blocks.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, code) of every ```python block."""
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in _BLOCK.finditer(text)]


BLOCKS = python_blocks(README.read_text())


def test_the_readme_has_python_blocks() -> None:
    assert BLOCKS, "no ```python block found in the README"


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_block_runs(line: int, code: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compiled = compile("\n" * (line - 1) + code, str(README), "exec")  # tracebacks point at README lines
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compiled, {"__name__": f"readme_block_{line}"})
    finally:
        os.chdir(cwd)
    capsys.readouterr()


def test_the_library_example_prints_what_the_readme_says(capsys: pytest.CaptureFixture[str]) -> None:
    text = README.read_text()
    section = text[text.index("## The library"):text.index("### From the command line")]
    (line, code), = python_blocks(section)[:1]
    exec(compile(code, str(README), "exec"), {"__name__": "readme_library"})
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("MappedWeights(mapped=10, copied=0, missing=0, still_meta=0, ")
    assert out[1:] == ["engine 0: released 0, dropped 1, kept 0", "engine 1: released 4, dropped 0, kept 0",
                       "engine 2: released 4, dropped 0, kept 0", "engine 3: released 1, dropped 0, kept 0"]
    assert "`engine 0: released 0, dropped 1, kept 0`, then `released 4`" in " ".join(section.split())
