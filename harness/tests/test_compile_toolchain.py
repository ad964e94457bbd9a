"""The C++ toolchain check: engines linked with a static libstdc++ crash when loaded, so such a compiler is refused."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import torch

from harness.engines.compile.inductor import EngineBuildError, InductorCompiler
from harness.engines.compile.toolchain import ToolchainError, check_toolchain, inductor_cxx, linked_libstdcxx
from harness.engines.registry import BackendUnavailable, check_backend


def _fake_compiler(tmp_path: Path, prints: str) -> str:
    """A compiler that answers ``--version`` and prints ``prints`` for ``-print-file-name=...``."""
    path = tmp_path / "g++-fake"
    path.write_text(f'#!/bin/sh\ncase "$1" in\n  --version) echo "g++-fake 1.0";;\n  *) echo "{prints}";;\nesac\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_this_machines_compiler_links_libstdcxx_dynamically() -> None:
    found = check_toolchain()
    assert found.cxx == inductor_cxx()
    assert Path(found.libstdcxx).is_file()
    assert Path(found.libstdcxx).name.startswith("libstdc++.so")


def test_a_compiler_without_a_shared_libstdcxx_is_refused_by_name(tmp_path: Path) -> None:
    fake = _fake_compiler(tmp_path, "libstdc++.so")  # the bare name: not found, it would link libstdc++.a
    assert linked_libstdcxx(fake) is None
    with pytest.raises(ToolchainError) as err:
        check_toolchain(fake)
    message = str(err.value)
    assert fake in message and "static" in message and "CXX=" in message


def test_a_compiler_that_finds_a_shared_libstdcxx_passes(tmp_path: Path) -> None:
    library = tmp_path / "libstdc++.so"
    library.write_bytes(b"")
    assert check_toolchain(_fake_compiler(tmp_path, str(library))).libstdcxx == str(library)


def test_a_missing_compiler_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError):
        check_toolchain(str(tmp_path / "no-such-g++"))


def test_the_backend_and_the_compiler_session_refuse_such_a_toolchain(tmp_path: Path) -> None:
    fake = _fake_compiler(tmp_path, "libstdc++.so")
    with torch._inductor.config.patch({"cpp.cxx": (fake,)}):
        assert inductor_cxx() == fake
        with pytest.raises(BackendUnavailable, match="static"):
            check_backend("inductor")  # before any strategy runs
        with pytest.raises(EngineBuildError, match="g[+][+]-fake"), InductorCompiler().session(tmp_path / "cache"):
            pass
    check_backend("inductor")  # the machine's own compiler passes again
