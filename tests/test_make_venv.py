"""The venv the Makefile makes has its own script for each tool the README names.

The venv is made with ``--system-site-packages``. Where the base Python already has pytest,
pip counts it as installed and writes no script into the venv, so `pytest` in the activated
venv is the base's, which imports no torch. ``make venv-tools`` (the first step of ``make
install``) must install the tools into the venv all the same.

The test runs that step on a fresh venv under ``tmp_path``: it installs the three tools alone
(no dependencies, no torch), from the package index, in a few seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_make_venv_tools_gives_the_venv_its_own_pytest_ruff_and_mypy(tmp_path: Path) -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed: the Makefile cannot run here")
    venv = tmp_path / "venv"
    env = {**os.environ, "PIP_CACHE_DIR": str(tmp_path / "pip-cache")}
    done = subprocess.run(
        [make, "--no-print-directory", "-C", str(ROOT), f"VENV={venv}", f"PYTHON={sys.executable}", "venv-tools"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, f"make venv-tools failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"

    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    bin_dir = venv / "bin"
    python = bin_dir / "python"
    for tool in ("pytest", "mypy"):
        script = bin_dir / tool
        assert script.is_file(), f"{script}: missing; `{tool}` in the activated venv would be the base Python's"
        first = script.read_text().splitlines()[0]
        assert first == f"#!{python}", f"{script}: runs {first!r}, not the venv's own {python}"
    ruff = bin_dir / "ruff"
    assert ruff.is_file() and os.access(ruff, os.X_OK), f"{ruff}: missing or not executable"
    # What an activated venv resolves: its bin directory first on PATH.
    path = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    assert shutil.which("pytest", path=path) == str(bin_dir / "pytest")
