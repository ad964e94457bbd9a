"""What the harness names, and how results show each name: strategies and the weight settings, without torch.

The strategy names, their labels and their colours are declared here once. The strategy
registry (:data:`harness.load.strategies.STRATEGIES`) gives each name here its loader and
release plan; scenario validation, the results and the figures need only what is here, so
reading a scenario or rendering results imports no torch. The backends are :mod:`harness.backends`'.

:data:`STRATEGY_LISTINGS` is in the order scenarios run strategies by default
(:data:`DEFAULT_STRATEGIES`, every one that needs no optional package, when a scenario lists none),
which is also the order the figures take their colours in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BUILT_WITHOUT_READING_WEIGHTS",
    "BUILT_WITHOUT_RESIDENT_WEIGHTS",
    "ENGINE_WEIGHTS",
    "FETCHED_PER_ENGINE",
    "HOLDS_WEIGHTS",
    "STRATEGY_LISTINGS",
    "DEFAULT_STRATEGIES",
    "StrategyListing",
    "builds_read_weights",
    "is_gpu",
    "writes_weights_to_files",
    "peers_of",
    "strategy_colour",
    "strategy_label",
]


@dataclass(frozen=True)
class StrategyListing:
    """One strategy as scenarios and results name it: its name, its label in tables and figures, its colour, and
    the strategy it is a variant of (``variant_of``: the same loader with one setting changed; ``None`` for a way
    of loading of its own, a peer), and the optional package its loader needs (``package``; such a strategy runs
    only where a scenario lists it)."""

    name: str
    label: str
    colour: str
    variant_of: str | None = None
    package: str | None = None


STRATEGY_LISTINGS: dict[str, StrategyListing] = {
    s.name: s
    for s in (
        StrategyListing("map", "map_weights, pages dropped after each engine", "#0072B2"),
        StrategyListing("load", "read into host memory + load_state_dict", "#D55E00"),
        StrategyListing("load_file", "safetensors load_file + assign", "#CC79A7"),
        StrategyListing("torch_mmap", "torch.load(mmap=True) of a .pt + assign", "#999933"),
        StrategyListing("stream", "safe_open per engine (views), dropped after it", "#882255"),
        StrategyListing("read_file", "safe_open, pread backend, per engine (copies), dropped after it", "#117733"),
        StrategyListing("map_no_prefetch", "map_weights, pages dropped after each engine, no prefetch", "#332288",
                        variant_of="map"),
        StrategyListing("map_keep_cache", "map_weights, pages dropped after each engine, kept in the page cache",
                        "#44AA99", variant_of="map"),
        StrategyListing("st_prefetch", "safetensors prefetch to the device, one engine ahead, dropped after it",
                        "#E69F00", package="safetensors>=0.9.0rc1"),
        StrategyListing("st_prefetch_whole", "safetensors prefetch of the whole plan, one open, each tensor dropped "
                        "after its last engine", "#DDCC77", package="safetensors>=0.9.0rc1"),
        StrategyListing("fastsafetensors", "fastsafetensors per engine (filtered, buffers sized to it), dropped "
                        "after it", "#56B4E9", package="fastsafetensors==0.5.0"),
        StrategyListing("fastsafetensors_whole", "fastsafetensors over the whole checkpoint, one open, each tensor "
                        "dropped after its last engine", "#88CCEE", package="fastsafetensors==0.5.0"),
        StrategyListing("instanttensor", "instanttensor per engine (buffers sized to it, clones on the device), "
                        "dropped after it", "#CC6677", package="instanttensor==0.2.2"),
        StrategyListing("instanttensor_whole", "instanttensor over the whole checkpoint, one open, each tensor "
                        "dropped after its last engine", "#661100", package="instanttensor==0.2.2"),
    )
}
"""Every strategy, in the order scenarios list and run them."""

DEFAULT_STRATEGIES: tuple[str, ...] = tuple(n for n, s in STRATEGY_LISTINGS.items() if s.package is None)
"""What a scenario that lists no strategies runs: every strategy that needs no optional package."""

FETCHED_PER_ENGINE: dict[str, str] = {
    "stream": "opening its tensors as views",
    "read_file": "reading its tensors with pread",
    "st_prefetch": "taking its prefetched tensors",
    "st_prefetch_whole": "taking its tensors from the whole plan's prefetch",
    "fastsafetensors": "copying its tensors to the device",
    "fastsafetensors_whole": "reading the whole checkpoint's loader on to its tensors",
    "instanttensor": "reading its tensors to the device",
    "instanttensor_whole": "reading the whole checkpoint's loader on to its tensors",
}
"""The strategies that get each engine's tensors inside its span, right before its build (their per-engine
hooks, :class:`harness.load.strategies.EngineHooks`), and what getting them is."""

HEADLINE_STRATEGY = "map"
"""The strategy the project is about: budget mode sweeps it more finely and holds it to the goal limit."""

ENGINE_WEIGHTS: tuple[str, ...] = ("packaged", "packaged_compiler", "mapped")
"""A compiler backend's weight settings (``[build] weights``): engines that run on the model's own tensors
(``mapped``), or that hold their weights, written into the artifact by the harness from the model's tensors
(``packaged``) or by the compiler itself (``packaged_compiler``); each compiler backend builds some of them
(:attr:`harness.backends.spec.BackendSpec.weights`)."""

HOLDS_WEIGHTS: tuple[str, ...] = ("packaged", "packaged_compiler")
"""The weight settings whose engines hold their weights."""

BUILT_WITHOUT_RESIDENT_WEIGHTS: tuple[str, ...] = ("mapped", "packaged")
"""The weight settings whose engines, built on the host, need no weight resident while they are built:
``mapped`` engines run on the mapped weights where they lie, and ``packaged`` ones have theirs streamed
into the artifact a chunk at a time, each chunk's pages dropped once written."""

BUILT_WITHOUT_READING_WEIGHTS: tuple[str, ...] = ("mapped",)
"""The weight settings whose engines, built on the host, never read their weights while built: compiled to run
on the mapped weights where they lie, they read them only when the built model runs."""


def is_gpu(device: str) -> bool:
    """Whether ``device``, as a resolved plan and a run's record name it (``cpu``, ``cuda``, ``cuda:<n>``), is a
    GPU: engines built there live in GPU memory, which decides their floor. Every test of a device asks this."""
    return device.startswith("cuda")


def builds_read_weights(on_gpu: bool, compiler_weights: str | None) -> bool:
    """Whether engine builds read their weights: all do but a compiler's built on the host with a weight setting of
    :data:`BUILT_WITHOUT_READING_WEIGHTS` (``compiler_weights`` is ``None`` for a backend that is no compiler)."""
    return on_gpu or compiler_weights not in BUILT_WITHOUT_READING_WEIGHTS


def writes_weights_to_files(on_gpu: bool, compiler_weights: str | None) -> bool:
    """Whether the engine builds write their weights' bytes into files: the ``copy`` backend's on the host (its
    engines are files there) and a compiler's whose engines hold their weights (:data:`HOLDS_WEIGHTS`);
    ``compiler_weights`` is ``None`` for a backend that is no compiler."""
    if compiler_weights is None:
        return not on_gpu
    return compiler_weights in HOLDS_WEIGHTS


def peers_of(name: str, names: Sequence[str]) -> list[str]:
    """The strategies of ``names`` that are other ways of loading than ``name``: neither ``name`` nor a variant
    of it (nor what it is a variant of). A name outside the catalog is a peer."""
    def base(n: str) -> str:
        listing = STRATEGY_LISTINGS.get(n)
        return listing.variant_of if listing is not None and listing.variant_of is not None else n

    return [n for n in names if base(n) != base(name)]


_EXTRA_COLOURS = ("#882255", "#999933", "#332288", "#117733", "#AA4499")


def strategy_colour(name: str, order: Sequence[str]) -> str:
    """The colour of strategy ``name``; a name not in the catalog (results of another version) takes
    one by its position among such names in ``order``."""
    if name in STRATEGY_LISTINGS:
        return STRATEGY_LISTINGS[name].colour
    others = [n for n in order if n not in STRATEGY_LISTINGS]
    index = others.index(name) if name in others else len(others)
    return _EXTRA_COLOURS[index % len(_EXTRA_COLOURS)]


def strategy_label(name: str) -> str:
    """The catalog's label of ``name``; empty for a name it does not know."""
    return STRATEGY_LISTINGS[name].label if name in STRATEGY_LISTINGS else ""
