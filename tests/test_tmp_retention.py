"""The project's pytest settings remove a passing test's ``tmp_path`` when it ends.

Some tests write checkpoints of hundreds of MiB; kept for pytest's default three runs, a
full run's temporary files came to gigabytes. A failing test's directory is kept, to be read.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_TESTS = """
from pathlib import Path

RECORD = Path({record!r})


def test_passes(tmp_path):
    (tmp_path / "written").write_bytes(b"x" * 4096)
    with RECORD.open("a") as out:
        out.write(f"passed {{tmp_path}}\\n")


def test_fails(tmp_path):
    (tmp_path / "written").write_bytes(b"x" * 4096)
    with RECORD.open("a") as out:
        out.write(f"failed {{tmp_path}}\\n")
    assert False
"""


def test_a_passing_tests_tmp_path_is_removed_and_a_failing_ones_kept(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    tests = tmp_path / "test_two.py"
    tests.write_text(textwrap.dedent(_TESTS.format(record=str(record))))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
         "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "base"), str(tests)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert done.returncode == 1 and "1 failed, 1 passed" in done.stdout, done.stdout + done.stderr
    written = dict(line.split(" ", 1) for line in record.read_text().splitlines())
    assert not Path(written["passed"]).exists(), f"{written['passed']}: a passing test's tmp_path was kept"
    assert (Path(written["failed"]) / "written").is_file(), f"{written['failed']}: a failing test's tmp_path went"
