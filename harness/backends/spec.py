"""What a backend is, said once: :class:`BackendSpec`, one per backend, registered in :mod:`harness.backends`.

A spec is plain data and imports no torch, so that validating a scenario, writing the machine line and rendering
a report read it without loading a compiler. What must run code (the check of why a backend cannot run here, its
builder's factory) is named by a :data:`Ref`, ``"module:attribute"``, imported only when it is called
(:func:`resolve`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.backends.columns import EngineColumns

__all__ = ["BackendMemory", "BackendSpec", "OwnBytes", "Package", "Ref", "TwoCalls", "WeightCopies", "resolve"]

Ref = str
"""``"package.module:attribute"``: code imported when it is needed (see :func:`resolve`)."""


def resolve(ref: Ref) -> Callable[..., Any]:
    """The attribute ``ref`` names, its module imported now; ``ValueError`` naming ``ref`` where it is not of the
    form ``module:attribute`` or its module holds no such attribute (an error in the registry, not the user's)."""
    module, sep, attribute = ref.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"{ref!r}: expected 'module:attribute'")
    found = getattr(importlib.import_module(module), attribute, None)
    if not callable(found):
        raise ValueError(f"{ref!r}: module {module} has no callable {attribute}")
    return found


@dataclass(frozen=True)
class Package:
    """An optional package a backend builds with, as the machine line names its version: ``key`` in the record's
    ``versions``, and the distributions that may provide it, the first installed one's version taken."""

    key: str
    distributions: tuple[str, ...]


@dataclass(frozen=True)
class TwoCalls:
    """How the report names the two calls of a compiler that converts, then compiles: the conversion, and the
    compile with its artifact written."""

    convert: str
    compile: str


@dataclass(frozen=True)
class OwnBytes:
    """What a backend holds of its own while it builds an engine, beside any copy of the weights: ``bytes``,
    anonymous host memory; ``fact``: how it was measured, naming the committed run; ``result``: the committed
    results directory (``results/<result>``) whose ``map`` strategy set it, which ``predict --check`` marks and
    leaves out of its goals (None where no single run set it and ``fact`` says what it rests on)."""

    bytes: int
    fact: str
    result: str | None = None


@dataclass(frozen=True)
class WeightCopies:
    """Copies of an engine's weights a backend makes while it builds an engine with weight setting ``weights``,
    in engine bytes (``copies`` x the engine's weight bytes, anonymous host memory); ``fact`` and ``result`` as
    for :class:`OwnBytes` (``result`` None where the figure follows from the compiler's code and runs only check
    it)."""

    weights: str
    copies: float
    fact: str
    result: str | None = None


@dataclass(frozen=True)
class BackendMemory:
    """A backend's measured memory while it builds one engine, read by the predictor
    (:func:`~harness.predict.rules.compiler_own_bytes`: ``own`` bytes + the copies of its weight setting x the
    engine). ``own``: None states none, predicted as 0; ``copies``: one entry per weight setting that copies, a
    setting without one copying nothing. A backend that states no memory predicts neither."""

    own: OwnBytes | None = None
    copies: tuple[WeightCopies, ...] = ()

    @property
    def own_bytes(self) -> int:
        """The fixed bytes it holds of its own (0 where it states none)."""
        return self.own.bytes if self.own is not None else 0

    def copies_of(self, weights: str | None) -> float:
        """The copies of an engine's weights it makes with weight setting ``weights`` (0 where it states none)."""
        return next((c.copies for c in self.copies if c.weights == weights), 0.0)

    def sources(self) -> dict[str, str]:
        """The committed results that set a figure of it, each with what it set (``own bytes``, ``weight copies
        (<setting>)``; several joined by ``, ``)."""
        found: dict[str, list[str]] = {}
        if self.own is not None and self.own.result is not None:
            found.setdefault(self.own.result, []).append("own bytes")
        for c in self.copies:
            if c.result is not None:
                found.setdefault(c.result, []).append(f"weight copies ({c.weights})")
        return {result: ", ".join(what) for result, what in found.items()}


@dataclass(frozen=True)
class BackendSpec:
    """One backend: everything the harness knows of it outside its own module.

    ``name``: what ``[build] backend`` names it; ``title``: how text names what builds its engines.
    ``missing``: the check of why it cannot run here (a :data:`Ref` to a function of no argument returning the
    reason, which follows "backend '<name>' needs <title>: ", or None when it can run; None: it runs everywhere);
    ``extra``: the optional dependencies (``pip install -e '.[<extra>]'``) that install what it needs;
    ``packages``: those packages, as the machine line names their versions.
    ``compiler``: whether it exports the model and builds engines from graph partitions (a compiler takes a
    weight setting and example inputs; a scenario of one needs a model with a forward); ``weights``: the weight
    settings it builds, the first its default where a scenario gives none and it builds that one only;
    ``weights_missing``: why it cannot build with one of them here (a :data:`Ref` to a function of the setting
    returning the reason, which follows "backend '<name>' with weights = "<setting>" ", or None).
    ``devices``: the device types its engines are built for (``cpu``, ``cuda``).
    ``columns``: the column groups its builds record per engine (:mod:`harness.backends.columns`).
    ``two_calls``: for a compiler that converts, then compiles, how the report names the two calls.
    ``memory``: what it holds of its own while it builds an engine, as measured (:class:`BackendMemory`; the
    default states none: no own bytes, no copies).
    ``factory``: its builder's factory (None: none in this version, so it is refused before anything runs): for a
    compiler, a :data:`Ref` to ``make_compiler(weights=..., device=..., release=...)`` returning its
    :class:`~harness.engines.compile.compiler.EngineCompiler`, which one generic builder drives
    (:mod:`harness.engines.registry`); otherwise to ``make_builder(plan, workdir)`` returning its
    :class:`~harness.engines.builder.EngineBuilder`.
    """

    name: str
    title: str
    factory: Ref | None
    columns: tuple[type[EngineColumns], ...]
    devices: tuple[str, ...] = ("cpu", "cuda")
    missing: Ref | None = None
    extra: str | None = None
    packages: tuple[Package, ...] = ()
    compiler: bool = False
    weights: tuple[str, ...] = ()
    weights_missing: Ref | None = None
    two_calls: TwoCalls | None = None
    memory: BackendMemory = BackendMemory()

    def __post_init__(self) -> None:
        if self.compiler != bool(self.weights):
            raise ValueError(f"backend {self.name!r}: a compiler builds at least one weight setting, and only a "
                             f"compiler takes one (compiler={self.compiler}, weights={self.weights})")
        settings = [c.weights for c in self.memory.copies]
        for setting in settings:
            if setting not in self.weights or settings.count(setting) > 1:
                raise ValueError(f"backend {self.name!r}: memory states weight copies for {setting!r}, which must "
                                 f"be one of its weight settings {self.weights}, stated once")

    @property
    def default_weights(self) -> str | None:
        """The weight setting a scenario that gives none takes where the backend builds one only; else None."""
        return self.weights[0] if len(self.weights) == 1 else None

    def builds_on(self, device: str) -> bool:
        """Whether engines for ``device`` (``cpu``, ``cuda``, ``cuda:<n>``) are built by this backend."""
        return device.split(":")[0] in self.devices
