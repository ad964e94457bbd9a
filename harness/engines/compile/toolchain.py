"""The C++ compiler AOTInductor links engines with, checked before anything is compiled.

AOTInductor compiles each engine's wrapper with the C++ compiler inductor is configured
with (``torch._inductor.config.cpp.cxx``, by default ``$CXX`` or ``g++``) and links it into a
shared library. Where that compiler finds no ``libstdc++.so`` to link against, it quietly
links the static ``libstdc++.a`` into every engine. Such an engine carries a second copy of
the C++ runtime whose exported symbols mix with the process's own ``libstdc++.so.6`` when
it is loaded, and the process dies (SIGSEGV, no Python error) the first time the engine
uses the runtime's locale: on CUDA, in ``std::regex`` while the engine parses its device
string, before any weight is touched. It was seen with a GCC wrapper whose search path held
only ``libstdc++.a``.

:func:`check_toolchain` asks the compiler where ``libstdc++.so`` is (``-print-file-name``)
and raises :class:`ToolchainError`, naming the compiler and the fix, when it has none.
The harness checks before any strategy runs (``check_backend``) and again when a compiler
session opens (:meth:`~harness.engines.compile.inductor.InductorCompiler.session`).
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass

__all__ = ["Toolchain", "ToolchainError", "check_toolchain", "inductor_cxx", "inductor_missing", "linked_libstdcxx"]


class ToolchainError(RuntimeError):
    """The C++ compiler would build engines that crash when loaded; the message names it and the fix."""


@dataclass(frozen=True)
class Toolchain:
    """The compiler inductor will run, and the ``libstdc++.so`` it links engines against."""

    cxx: str
    libstdcxx: str


def inductor_cxx() -> str:
    """The C++ compiler inductor builds engines with (its own search: ``config.cpp.cxx``, ``$CXX``)."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    return str(get_cpp_compiler())


@functools.lru_cache(maxsize=8)
def linked_libstdcxx(cxx: str) -> str | None:
    """The ``libstdc++.so`` that ``cxx`` links against, or None where it has none (it would link the static one).

    ``cxx -print-file-name=libstdc++.so`` prints a path when it finds the library and the
    bare name when it does not.
    """
    try:
        found = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True,
                               timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return found if os.path.isabs(found) and os.path.exists(found) else None


def check_toolchain(cxx: str | None = None) -> Toolchain:
    """The toolchain engines will be linked with; :class:`ToolchainError` where they would crash on load.

    ``cxx``: the compiler to check (default: the one inductor will use, :func:`inductor_cxx`).

    >>> check_toolchain().libstdcxx  # doctest: +SKIP
    '/usr/lib/gcc/x86_64-linux-gnu/12/libstdc++.so'
    """
    compiler = cxx if cxx is not None else inductor_cxx()
    library = linked_libstdcxx(compiler)
    if library is None:
        raise ToolchainError(
            f"the C++ compiler AOTInductor would use ({compiler}) finds no libstdc++.so to link against "
            f"(`{compiler} -print-file-name=libstdc++.so` names no file), so it would link the static "
            "libstdc++ into every engine, and such an engine crashes the process when it is loaded "
            "(SIGSEGV in the C++ runtime's std::regex, before any weight is read); set CXX to a compiler "
            "that links libstdc++ dynamically (e.g. CXX=/usr/bin/g++) before the run starts"
        )
    return Toolchain(compiler, library)


def inductor_missing() -> str | None:
    """Why AOTInductor cannot build here: ``torch._inductor`` does not import, or its C++ compiler is missing or
    links engines that crash when loaded (:func:`check_toolchain`); None when it can."""
    try:
        import torch._inductor  # noqa: F401
    except Exception as exc:
        return f"torch._inductor is not importable ({type(exc).__name__}: {exc})"
    # outside the try: an error in the harness's own modules is a bug to show, not a missing compiler
    try:
        cxx = inductor_cxx()
    except Exception as exc:  # torch's InvalidCxxCompiler: none of its candidates runs
        return f"no C++ compiler found (g++ or $CXX; {type(exc).__name__})"
    try:
        check_toolchain(cxx)
    except ToolchainError as exc:
        return str(exc)
    return None
