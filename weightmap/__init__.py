"""weightmap: map safetensors checkpoints zero-copy into PyTorch models.

Compiling a large model partition by partition needs each weight only while
the engines that read it are built. Instead of loading the checkpoint,
``weightmap`` maps it: every parameter and buffer becomes a view of the file,
its pages come in only when something reads them, and they are dropped again
after the last engine that reads them is built.

Public API:

* :func:`init_empty_weights` builds a model with its parameters on the meta
  device (no memory for weights) and its buffers computed as usual, so that the
  model runs once its weights are mapped; ties made in ``__init__`` stay ties.
* :func:`map_weights` points a module's or an ExportedProgram's tensors at
  zero-copy, copy-on-write views of a checkpoint and returns a
  :class:`MappedWeights` report/handle: the state ``load_state_dict`` would give
  (ties, storage ties of other views, tensors that share an entry through
  ``key_map`` independent), or an error before any change. :func:`preview_mapping`
  says what it would do (a :class:`MappingPreview`) from the headers, reading no
  weight but a tie held twice, compared and dropped from the page cache again.
* :func:`assert_runnable` raises unless no tensor of a model is left on the meta
  device (``map_weights`` accepts non-persistent buffers that no checkpoint holds,
  as ``load_state_dict`` does; this says whether the model can run).
* :func:`release_mapped_storage` drops a mapped storage's resident pages
  (``madvise(MADV_DONTNEED)``); the tensor stays valid and re-reads the file.
  :func:`release_storage` releases any weight after its last use: mapped ones
  by dropping pages; ordinary ones only with ``resize=True`` (``resize_(0)``),
  since a resized tensor crashes the process when read, and never while
  another tensor views the storage.
* :class:`ReleasePlan` releases weights as partitions are built: a mapped
  weight's pages after every partition that reads it (``reread=False``: after
  the last one only), an ordinary weight after its last reader when the plan
  was made with ``resize=True``. Made with ``prefetch=`` (one of
  :data:`PREFETCH_METHODS`), it also warms the page cache for the partition
  after the one being built, on a background thread, so the disk reads it
  while this one builds; the process's RSS does not rise.
* :class:`Prefetcher` and :func:`file_ranges` do the same warming for a builder
  without a plan; :class:`FileRange` and :class:`PrefetchStats` are what they
  take and report, ``PrefetchMethod`` the type of a method's name.
* :func:`save_weights_for_mapping` writes a model's weights as a checkpoint that
  maps without copies; :func:`convert_checkpoint` rewrites a checkpoint so
  (aligned, cast to the dtypes it runs in), one tensor in memory at a time.
* :func:`inspect_checkpoint` summarises a checkpoint from its headers (a
  :class:`CheckpointReport`), and with a model what mapping it would do.
  ``python -m weightmap inspect|convert`` runs these two from the command line.
* Errors are :class:`MappingError` (a ``ValueError``); header problems are
  :class:`HeaderError`.

The building blocks the above are made of, for a caller that reads, writes or walks
checkpoints and models itself (the benchmark harness does):

* :func:`open_checkpoint` resolves a path (a file, a directory, a sharded index) to a
  :class:`Checkpoint`, every header read and validated; :func:`read_header` reads and
  validates one file's header (a :class:`Header`), never its data.
* :func:`write_checkpoint` streams a safetensors file described by :class:`TensorSpec`
  entries, one tensor in memory at a time, replacing the file in one step.
* :func:`collect_targets` lists every tensor of a module or an ExportedProgram as a
  :class:`Target`: each name it is registered under, its slots, its ties.
* :func:`non_regular_kind` says what a path that is not a regular file is ("a named
  pipe (FIFO)", ...), for errors; it needs no torch.
* :func:`parse_size` reads a size as ``--max-shard-size`` and transformers' ``max_shard_size``
  take it (``"5GB"``, ``"500MiB"``) in bytes; it needs no torch.

Each name is imported on first use, so that what needs no torch (``PREFETCH_METHODS``,
:mod:`weightmap.filekinds`, reading headers) imports without it.

Example (the README's "The library" section has one that runs as written)::

    from weightmap import ReleasePlan, init_empty_weights, map_weights

    with init_empty_weights():
        model = MyModel()             # parameters on meta, buffers computed
    with map_weights(model, "model.safetensors", strict=True) as mapped:
        print(f"{mapped.nbytes / 2**30:.2f} GiB mapped, nothing read yet")
    with ReleasePlan.from_names(model, [names_of(p) for p in partitions], prefetch="madvise") as plan:
        plan.prefetch(0)              # partitions 0 and 1 start coming in from the disk
        for i, part in enumerate(partitions):
            build_engine(part)        # meanwhile partition i + 1 is read into the page cache
            plan.built(i)             # drops what partition i read; warms partition i + 2
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from weightmap.checkpoint import Checkpoint, open_checkpoint
    from weightmap.convert import convert_checkpoint
    from weightmap.empty import init_empty_weights
    from weightmap.errors import HeaderError, MappingError
    from weightmap.filekinds import non_regular_kind
    from weightmap.format import Header, read_header
    from weightmap.inspection import CheckpointReport, inspect_checkpoint
    from weightmap.mapping import MappedWeights, MappingPreview, map_weights, preview_mapping
    from weightmap.plan import ReleasePlan, ReleaseStep
    from weightmap.prefetch import PREFETCH_METHODS, FileRange, Prefetcher, PrefetchMethod, PrefetchStats, file_ranges
    from weightmap.release import release_mapped_storage, release_storage
    from weightmap.runnable import assert_runnable
    from weightmap.sizes import parse_size
    from weightmap.streamwrite import TensorSpec, write_checkpoint
    from weightmap.targets import Target, collect_targets
    from weightmap.writer import save_weights_for_mapping

__version__ = "0.1.0"

__all__ = [
    "PREFETCH_METHODS",
    "Checkpoint",
    "CheckpointReport",
    "FileRange",
    "Header",
    "HeaderError",
    "MappedWeights",
    "MappingError",
    "MappingPreview",
    "PrefetchMethod",
    "PrefetchStats",
    "Prefetcher",
    "ReleasePlan",
    "ReleaseStep",
    "Target",
    "TensorSpec",
    "assert_runnable",
    "collect_targets",
    "convert_checkpoint",
    "file_ranges",
    "init_empty_weights",
    "inspect_checkpoint",
    "map_weights",
    "non_regular_kind",
    "open_checkpoint",
    "parse_size",
    "preview_mapping",
    "read_header",
    "release_mapped_storage",
    "release_storage",
    "save_weights_for_mapping",
    "write_checkpoint",
]


_WHERE: dict[str, str] = {
    "convert_checkpoint": "weightmap.convert",
    "init_empty_weights": "weightmap.empty",
    "HeaderError": "weightmap.errors",
    "MappingError": "weightmap.errors",
    "CheckpointReport": "weightmap.inspection",
    "inspect_checkpoint": "weightmap.inspection",
    "MappedWeights": "weightmap.mapping",
    "MappingPreview": "weightmap.mapping",
    "map_weights": "weightmap.mapping",
    "preview_mapping": "weightmap.mapping",
    "ReleasePlan": "weightmap.plan",
    "ReleaseStep": "weightmap.plan",
    "PREFETCH_METHODS": "weightmap.prefetch",
    "FileRange": "weightmap.prefetch",
    "Prefetcher": "weightmap.prefetch",
    "PrefetchMethod": "weightmap.prefetch",
    "PrefetchStats": "weightmap.prefetch",
    "file_ranges": "weightmap.prefetch",
    "release_mapped_storage": "weightmap.release",
    "release_storage": "weightmap.release",
    "assert_runnable": "weightmap.runnable",
    "save_weights_for_mapping": "weightmap.writer",
    "Checkpoint": "weightmap.checkpoint",
    "open_checkpoint": "weightmap.checkpoint",
    "non_regular_kind": "weightmap.filekinds",
    "parse_size": "weightmap.sizes",
    "Header": "weightmap.format",
    "TensorSpec": "weightmap.streamwrite",
    "read_header": "weightmap.format",
    "write_checkpoint": "weightmap.streamwrite",
    "Target": "weightmap.targets",
    "collect_targets": "weightmap.targets",
}
"""The module each public name lives in."""


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use (then it is an ordinary attribute)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'weightmap' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
