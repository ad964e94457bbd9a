"""Torch-TensorRT: no builder in this version of the harness, only the check of whether it could run here.

Its spec (:data:`harness.backends.BACKENDS`) has no factory, so a scenario that names it is refused before any
strategy runs: with why it cannot run where ``torch_tensorrt`` does not import, or with "not implemented" where
it does. A TensorRT builder would be an :class:`~harness.engines.compile.compiler.EngineCompiler` here, with a
``make_compiler``, and the spec's factory naming it.
"""

from __future__ import annotations

__all__ = ["torch_tensorrt_missing"]


def torch_tensorrt_missing() -> str | None:
    """Why Torch-TensorRT cannot run here: ``torch_tensorrt`` does not import (with what to do instead); None when
    it imports."""
    try:
        import torch_tensorrt  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything
        return (f"torch_tensorrt is not importable here ({type(exc).__name__}: {exc}). Use backend = \"copy\", "
                "or run on a machine where torch_tensorrt is installed.")
    return None
