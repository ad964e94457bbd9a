"""The rules that predict a strategy's memory from sizes alone, each stated once with the fact it rests on.

Every rule is a function of :class:`~harness.predict.inputs.PredictInputs`: the engines' weight bytes in build
order (``e_k``; ``E`` the largest, ``M`` the model), the baseline (RSS ``B``, anonymous ``A``), the strategy's
release behaviour (:data:`HOLDING`), the backend and its weight setting, and the device. No weight is read.

The constants below were measured by the harness on committed runs, each named in its docstring, and so were the
backends' own memory figures, each stated with its fact in the backend's registration
(:class:`~harness.backends.spec.BackendMemory` in :data:`~harness.backends.BACKENDS`);
:mod:`harness.tests.test_predict` recomputes every one of them from the committed record it names, so none is a
guess and none drifts from its source. The ``copy`` backend's rules use no constant at all.

:func:`predict` returns one :class:`Prediction` per strategy; a strategy no rule covers gets one whose figures are
``None`` and whose ``note`` says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from harness.backends import backend_memory
from harness.catalog import (
    BUILT_WITHOUT_RESIDENT_WEIGHTS,
    HOLDS_WEIGHTS,
    builds_read_weights,
    is_gpu,
)
from harness.predict.inputs import PredictInputs
from harness.results.metrics import engines_accumulate
from harness.units import MIB

__all__ = ["FIELDS", "HOLDING", "NO_GPU_RULE", "Prediction", "predict", "predict_strategy"]

FIELDS: tuple[str, ...] = ("build_peak_bytes", "host_peak_bytes", "anon_peak_bytes", "gpu_peak_bytes",
                           "minimum_bytes")
"""A prediction's figures, named as the records name what they measure: the first four as the run record does
(:class:`~harness.results.record.StrategyRecord`), the fifth as the budget record does
(:class:`~harness.budget.record.StrategyBudget`: the smallest memory-cgroup limit a strategy completed under)."""


@dataclass(frozen=True)
class Prediction:
    """One strategy's predicted figures, in bytes (``None``: no rule covers it, ``note`` says why; ``gpu_peak_bytes``
    is ``None`` off a GPU). ``build_peak_bytes``: host RSS from partitioning to the end of the last engine;
    ``host_peak_bytes``: host RSS over the whole run; ``anon_peak_bytes``: anonymous host memory over the whole run;
    ``gpu_peak_bytes``: GPU memory above the baseline taken once the CUDA context exists (as the run records it);
    ``minimum_bytes``: the smallest memory-cgroup limit the strategy completes under."""

    strategy: str
    build_peak_bytes: int | None
    host_peak_bytes: int | None
    anon_peak_bytes: int | None
    gpu_peak_bytes: int | None
    minimum_bytes: int | None
    note: str = ""

    def figures(self) -> dict[str, int | None]:
        """The five figures under their names (:data:`FIELDS`)."""
        return {name: getattr(self, name) for name in FIELDS}


# --------------------------------------------------------------------------- release behaviour

ENGINE = "engine"
"""Maps the checkpoint and holds the mapped pages of the engine being built until its release (``map`` and its
variants, ``stream``). Fact (results/pi05): every ``map`` engine's high-water mark is the baseline plus that
engine's bytes within 0.01 GiB; ``map`` and ``map_no_prefetch`` peak alike (1.216 and 1.218 GiB), so the
``madvise`` prefetch one engine ahead lands in the page cache, not in RSS."""

FILE = "file"
"""File-backed views of the whole checkpoint, never released (``load_file``, ``torch_mmap``): each page read stays
in RSS. Fact (results/pi05): both peak at the baseline plus the model (8.945 GiB) and their anonymous memory stays at
the baseline's; clean file pages, so a memory cgroup reclaims them (results/pi05-budget: 0.29 GiB)."""

TWO_COPIES = "two_copies"
"""Reads the whole checkpoint into anonymous memory and copies it into the model's ``to_empty`` tensors (``load``):
two copies until ``load_state_dict`` is done, then the model's one through the build. Fact (results/pi05): load
phase 17.686 GiB = baseline + 2 x the model; build phase 9.03 GiB."""

COPIES = "copies"
"""Reads each engine's tensors into buffers of its own, anonymous, dropped after the engine (``read_file``, and
``fastsafetensors`` on the host): the previous engine's buffers are still held when the next one's are read. Fact
(results/pi05 read_file): engine 1's high-water mark 1.727 GiB = baseline 0.226 + engine 0 (0.981) + engine 1
(0.515); engine 5's 1.704 = baseline + engine 4 + engine 5."""

DEVICE = "device"
"""Reads every tensor straight to the GPU the engines are built on, through fixed bounce buffers
(``fastsafetensors_whole``: the copier and the 16 MiB of bounce buffers of ``fastsafetensors``, opened once): the host
holds none of the weights. Fact (results/pi05-h200): ``fastsafetensors_whole`` peaks at 0.663 GiB on the host, the
baseline plus 0.06 GiB, the copy builder's pinned ring (32 MiB) among it. Off a GPU its tensors are the host's, in
an order of the loader's own: no rule (none measured)."""

STAGING = "staging"
"""Reads every tensor straight to the GPU through a pinned host staging buffer of its I/O capacity, held from the
open to the close whatever the model (``instanttensor_whole``, its defaults: :data:`STAGING_BYTES`). CUDA only."""

HOLDING: dict[str, str] = {
    "map": ENGINE, "map_no_prefetch": ENGINE, "map_keep_cache": ENGINE, "stream": ENGINE,
    "load_file": FILE, "torch_mmap": FILE,
    "load": TWO_COPIES,
    "read_file": COPIES, "fastsafetensors": COPIES,
    "fastsafetensors_whole": DEVICE,
    "instanttensor_whole": STAGING,
}
"""Each strategy a rule covers and how it holds its weights; :data:`NO_RULE` says why the others have none."""

NO_RULE: dict[str, str] = {
    "st_prefetch": ("measured on one machine only (results/pi05-h200, results/pi05-h200-peers), too few to check "
                    "one"),
    "instanttensor": ("its buffers sized to each engine were measured on one machine only (results/pi05-h200, "
                      "results/pi05-h200-peers), too few to check one"),
    "st_prefetch_whole": ("how far safetensors' background reads run ahead of the takes, and so how much of the "
                          "file's mapping is resident, is the loader's own"),
}
"""Why a strategy without a rule has none (its prediction's ``note``)."""

TO_DEVICE = ("fastsafetensors", "fastsafetensors_whole", "instanttensor_whole")
"""Strategies whose copies go to the GPU where engines are built on one, so the host holds none of them (no rule
covers their device buffers). Fact (results/pi05-h200): ``fastsafetensors`` peaks at 0.663 GiB on the host, the
baseline plus 0.06 GiB, the copy builder's pinned ring (32 MiB) among it."""

NO_GPU_RULE = ("no rule covers the device buffers of a loader whose copies go to the GPU: how many tensors wait there "
               "beside the engines is the loader's own (results/pi05-h200's GPU column, each in two uses)")
"""Why a :data:`TO_DEVICE` strategy's ``gpu_peak_bytes`` is ``None`` on a GPU (:func:`gpu_peak_bytes`)."""

DEVICE_ONLY = (DEVICE, STAGING)
"""The holdings whose rule holds on a GPU only."""

INSTANT_DEFAULT_IO_BYTES = 512 * 8 * MIB
"""instanttensor's I/O capacity with its defaults for a file on disk: 512 reads in flight (``io_depth``) of 8 MiB
(``chunk_size``), 4 GiB (its ``_impl.py``, 0.2.2)."""

STAGING_BYTES: dict[str, int] = {"instanttensor_whole": INSTANT_DEFAULT_IO_BYTES}
"""The pinned host staging of each :data:`STAGING` strategy, anonymous. Fact (results/pi05-h200,
``instanttensor_whole``: these defaults, one open for the whole checkpoint, holding it from the first engine to the
last): host peak 4.646 GiB = the baseline 0.601 + 4.045, of which 32 MiB are the copy builder's pinned ring; the
anonymous peak likewise."""


# --------------------------------------------------------------------------- constants

GPU_WORKSPACE_BYTES = 269 * MIB
"""GPU memory beside the one engine being built, for a compiler whose engines hold their weights and leave the GPU
once built (:data:`~harness.catalog.HOLDS_WEIGHTS`). Measured on results/lerobot-compile-packaged (``map``: GPU peak
less the largest engine). Miss: AOTInductor packaging its own weights (results/lerobot-compile-packaged-compiler)
peaked at 2.82 GiB on the GPU, 1.57 GiB over this rule, 18 % of the model."""

RECLAIM_FLOOR_BYTES = 36 * MIB
"""What a memory cgroup must leave above a strategy's anonymous peak for it to complete: the page cache its reads go
through and the pages it works on. Measured on results/smoke-budget (``map``: its minimum less its baseline's
anonymous memory); every committed sweep's bracket (largest failing, minimum] holds the prediction within 64 MiB.
The sweeps' minimums are the top of a bracket as wide as their precision (0.17 GiB for pi0.5), so on pi0.5 this rule
reads up to 0.10 GiB under the minimum yet inside the bracket."""


# --------------------------------------------------------------------------- the rules


def compiler_own_bytes(inputs: PredictInputs, engine_bytes: int) -> int:
    """What the backend holds of its own while it builds an engine of ``engine_bytes``: the own bytes its
    registration states plus the copies it states for the weight setting x the engine
    (:class:`~harness.backends.spec.BackendMemory`; 0 for a backend that states none, or is not registered).
    Anonymous memory."""
    memory = backend_memory(inputs.backend)
    return memory.own_bytes + int(memory.copies_of(inputs.compiler_weights) * engine_bytes)


def weights_while_building(inputs: PredictInputs, holding: str, strategy: str) -> list[tuple[int, int]]:
    """Per engine in build order: (host bytes of weights resident while it is built, of which anonymous).

    ``ENGINE``: the engine's own bytes, where the build reads them into the process (0 where it reads none or
    streams them a chunk at a time: :data:`~harness.catalog.BUILT_WITHOUT_RESIDENT_WEIGHTS` on the host); ``FILE``:
    every engine read so far (never released; 0 where builds read no weight); ``TWO_COPIES``: the model, anonymous;
    ``COPIES``: the previous engine and this one, anonymous (none on the host where they go to the GPU,
    :data:`TO_DEVICE`); ``DEVICE``: none (on a GPU); ``STAGING``: the pinned staging, anonymous (on a GPU).
    Fact for the weight-setting cases (results/smoke-compile, ``mapped``): ``load_file``'s
    build-phase peak is ``map``'s (0.391 and 0.387 GiB), no page of the file faulted in.
    """
    sizes = inputs.engine_bytes
    on_gpu = is_gpu(inputs.device)
    reads = builds_read_weights(on_gpu, inputs.compiler_weights)
    streamed = not on_gpu and inputs.compiler_weights in BUILT_WITHOUT_RESIDENT_WEIGHTS
    if holding == TWO_COPIES:
        return [(inputs.model_bytes, inputs.model_bytes) for _ in sizes]
    if holding == DEVICE:
        return [(0, 0) for _ in sizes]
    if holding == STAGING:
        return [(STAGING_BYTES[strategy], STAGING_BYTES[strategy]) for _ in sizes]
    if holding == COPIES:
        if on_gpu and strategy in TO_DEVICE:
            return [(0, 0) for _ in sizes]
        pairs = [sizes[0], *(a + b for a, b in pairwise(sizes))]
        return [(p, p) for p in pairs]
    if holding == FILE:
        if not reads:
            return [(0, 0) for _ in sizes]
        total, held = 0, []
        for size in sizes:  # a tied weight is in two engines' bytes but one file range
            total += size
            held.append((min(total, inputs.model_bytes), 0))
        return held
    return [(0 if streamed else size, 0) for size in sizes]


def load_phase_bytes(inputs: PredictInputs, holding: str) -> tuple[int, int]:
    """(Host, anonymous) bytes above the baseline at the end of the load: ``load`` holds two copies of the model
    (:data:`TWO_COPIES`); every other strategy loads nothing up front."""
    return (2 * inputs.model_bytes,) * 2 if holding == TWO_COPIES else (0, 0)


def gpu_peak_bytes(inputs: PredictInputs, strategy: str) -> int | None:
    """GPU memory above the baseline: the whole model where built engines stay on the GPU
    (:func:`~harness.catalog.engines_accumulate`; results/pi05-h200: 8.805 GiB for a model of 8.712 for every
    strategy, 0.09 GiB above it, not yet apportioned: see that run's notes), else the largest engine plus
    :data:`GPU_WORKSPACE_BYTES`. ``None`` off a GPU, and for :data:`TO_DEVICE` strategies (:data:`NO_GPU_RULE`)."""
    if not is_gpu(inputs.device) or strategy in TO_DEVICE:
        return None
    if engines_accumulate(True, inputs.compiler_weights):
        return inputs.model_bytes
    assert inputs.compiler_weights in HOLDS_WEIGHTS
    return inputs.largest_engine_bytes + GPU_WORKSPACE_BYTES


def predict_strategy(inputs: PredictInputs, strategy: str) -> Prediction:
    """One strategy's :class:`Prediction` (see the module docstring).

    build-phase peak = ``B + max over k of (weights resident while engine k is built + the compiler's own)``;
    whole-run peak = the larger of that and ``B +`` the load phase's; anonymous peak likewise from ``A`` with the
    anonymous parts alone; minimum limit = anonymous peak + :data:`RECLAIM_FLOOR_BYTES` (clean file pages are
    reclaimed under a cgroup's limit, anonymous ones are not: results/pi05-budget).
    """
    holding = HOLDING.get(strategy)
    if holding is None:
        return Prediction(strategy, None, None, None, None, None,
                          note=f"no rule: {NO_RULE.get(strategy, 'none stated')}")
    if holding in DEVICE_ONLY and not is_gpu(inputs.device):
        return Prediction(strategy, None, None, None, None, None,
                          note="no rule off a GPU: its tensors are the host's there, in an order of the loader's own")
    base = inputs.baseline
    held = weights_while_building(inputs, holding, strategy)
    own = [compiler_own_bytes(inputs, size) for size in inputs.engine_bytes]
    build = base.rss_bytes + max(h + o for (h, _), o in zip(held, own, strict=True))
    anon_build = base.anon_bytes + max(a + o for (_, a), o in zip(held, own, strict=True))
    load_host, load_anon = load_phase_bytes(inputs, holding)
    anon = max(anon_build, base.anon_bytes + load_anon)
    return Prediction(
        strategy=strategy,
        build_peak_bytes=build,
        host_peak_bytes=max(build, base.rss_bytes + load_host),
        anon_peak_bytes=anon,
        gpu_peak_bytes=gpu_peak_bytes(inputs, strategy),
        minimum_bytes=anon + RECLAIM_FLOOR_BYTES,
        note=holding,
    )


def predict(inputs: PredictInputs) -> dict[str, Prediction]:
    """Every strategy of ``inputs``, in its order: :func:`predict_strategy`."""
    return {name: predict_strategy(inputs, name) for name in inputs.strategies}
