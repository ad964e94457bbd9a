"""What a checkpoint holds and what mapping it would cost, from its headers alone.

:func:`inspect_checkpoint` reads and validates the headers of a checkpoint (a
``.safetensors`` file, a sharded directory or its index) exactly as
:func:`weightmap.map_weights` does, and summarises them: tensors, dtypes and bytes
per dtype, which tensors sit at an offset that is not a multiple of their item size
(those would be copied), the files and their header sizes, metadata. Given a model
(built under :func:`weightmap.init_empty_weights`) it also says what
:func:`weightmap.map_weights` would map, copy, miss or leave on meta.

No weight is read, except the entries of a tie the checkpoint holds under several
names when a model is given: they are compared as :func:`weightmap.map_weights`
compares them, and the pages that brought into the page cache are dropped again.
Headers are read with the kernel's read-ahead off, so that
reading a header brings no page of the data section into the page cache either
(a plain read of the first 64 KiB of a file makes the kernel read ahead about a
MiB of weights past it). ``python -m weightmap inspect`` prints the report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from weightmap.checkpoint import INDEX_NAME, Checkpoint, open_checkpoint
from weightmap.format import DTYPE_CODES, TensorEntry, check_little_endian
from weightmap.mapping import KeyMap, MappingPreview, preview_from
from weightmap.text import counted, is_are

__all__ = ["CheckpointReport", "DtypeSummary", "FileSummary", "inspect_checkpoint"]

_LISTED = 10  # names listed in the text report before "and N more"


@dataclass(frozen=True)
class FileSummary:
    """One file of a checkpoint: its size, its header's size and what it holds."""

    path: Path
    size: int
    header_bytes: int  # 8 + the JSON header: the data section starts here
    tensors: int
    nbytes: int  # bytes of its data section
    metadata: dict[str, str] | None


@dataclass(frozen=True)
class DtypeSummary:
    """Tensors and bytes of one dtype."""

    dtype: torch.dtype
    tensors: int
    nbytes: int

    @property
    def code(self) -> str:
        """The safetensors code (``BF16``, ``F32``, ...)."""
        return DTYPE_CODES[self.dtype]


@dataclass(frozen=True)
class CheckpointReport:
    """What :func:`inspect_checkpoint` found (see there); :meth:`to_text` and :meth:`to_json` render it."""

    source: Path
    index: Path | None  # the index of a sharded checkpoint
    files: list[FileSummary]
    entries: dict[str, TensorEntry] = field(repr=False)
    dtypes: list[DtypeSummary]
    misaligned: list[str]  # tensors whose offset is not a multiple of their item size: mapping copies them
    model: str | None = None
    fit: MappingPreview | None = None

    @property
    def tensors(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        """Bytes of all tensors (the data sections)."""
        return sum(f.nbytes for f in self.files)

    @property
    def size(self) -> int:
        """Bytes of all files, headers included."""
        return sum(f.size for f in self.files)

    @property
    def header_bytes(self) -> int:
        return sum(f.header_bytes for f in self.files)

    def to_text(self, *, list_tensors: bool = False) -> str:
        """The report as lines for a terminal (every tensor too with ``list_tensors``)."""
        return "\n".join(_text(self, list_tensors))

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (every tensor included)."""
        return _json(self)


def inspect_checkpoint(
    path: str | os.PathLike[str],
    model: torch.nn.Module | Any | None = None,
    *,
    key_map: KeyMap | None = None,
    model_name: str | None = None,
) -> CheckpointReport:
    """Summarise a checkpoint from its headers; with ``model``, what mapping it into the model would do.

    Contract:

    * ``path`` is what :func:`weightmap.map_weights` takes (a file, a sharded
      directory, an index). Every header is read from the file and validated by
      the same rules; an invalid one raises the same :class:`HeaderError` naming the
      file, the tensor and the rule. Nothing is mapped.
    * No weight is read: only the bytes of the headers (and of an index) are, with
      the kernel's read-ahead off, so no page of a data section enters the page
      cache beyond the page each header ends in (headers are read so wherever
      they are read, mapping included).
    * ``model`` (a module or an ExportedProgram, best built under
      :func:`weightmap.init_empty_weights`; ``key_map`` as for ``map_weights``) adds
      ``fit``, a :class:`weightmap.MappingPreview`: what ``map_weights`` would map,
      copy (and why), miss, leave on meta, leave alone, and what ``strict=True``
      would refuse. A model that ``map_weights`` would refuse whatever ``strict``
      says (a shape mismatch, a tie held twice with different values) raises its
      :class:`MappingError`. The model is not
      changed. A tie the checkpoint holds under several names is compared as
      ``map_weights`` compares it (its entries are read, and the pages that brought
      into the page cache are dropped again). ``model_name`` is how the report names it.

    Example::

        report = inspect_checkpoint("model.safetensors")
        print(report.to_text())
    """
    check_little_endian()
    source = Path(os.fsdecode(path))
    with open_checkpoint(source, keep_open=model is not None) as checkpoint:
        fit = preview_from(model, checkpoint, key_map=key_map) if model is not None else None
        return _report(checkpoint, fit, model_name if model is not None else None)


def _report(checkpoint: Checkpoint, fit: MappingPreview | None, model: str | None) -> CheckpointReport:
    files = [
        FileSummary(
            path=header.path,
            size=header.file_size,
            header_bytes=header.data_start,
            tensors=len(header.tensors),
            nbytes=header.file_size - header.data_start,
            metadata=header.metadata,
        )
        for header in checkpoint.headers
    ]
    entries = {name: entry for name, (_, entry) in checkpoint.entries.items()}
    by_dtype: dict[torch.dtype, list[int]] = {}
    for entry in entries.values():
        counts = by_dtype.setdefault(entry.dtype, [0, 0])
        counts[0] += 1
        counts[1] += entry.nbytes
    dtypes = sorted(
        (DtypeSummary(dtype, n, nbytes) for dtype, (n, nbytes) in by_dtype.items()),
        key=lambda d: (-d.nbytes, d.code),
    )
    misaligned = [name for name, entry in entries.items() if entry.numel and entry.start % entry.dtype.itemsize]
    index = _index_of(checkpoint)
    return CheckpointReport(checkpoint.source, index, files, entries, dtypes, misaligned, model, fit)


def _index_of(checkpoint: Checkpoint) -> Path | None:
    source = checkpoint.source
    if source.suffix == ".json":
        return source
    if source.is_dir() and (source / INDEX_NAME).exists():
        return source / INDEX_NAME
    return None


# --------------------------------------------------------------------------- rendering


def human(nbytes: int) -> str:
    """Bytes in binary units: ``"8.71 GiB"``, ``"512 B"``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{nbytes} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _names(names: list[str], limit: int = _LISTED) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _metadata_text(metadata: dict[str, str] | None) -> str:
    if not metadata:
        return "none"
    return ", ".join(f"{key}={value}" for key, value in metadata.items())


def _text(report: CheckpointReport, list_tensors: bool) -> Iterator[str]:
    files = report.files
    same_metadata = len({json.dumps(f.metadata, sort_keys=True) for f in files}) == 1
    yield f"checkpoint  {report.source}"
    if report.index is not None:
        yield f"index       {report.index.name}: {counted(len(files), 'shard')}"
    yield f"size        {report.size:,} bytes ({human(report.size)}), {counted(len(files), 'file')}"
    yield f"tensors     {report.tensors:,}, {report.nbytes:,} bytes ({human(report.nbytes)})"
    if len(files) == 1:
        f = files[0]
        yield f"header      {f.header_bytes:,} bytes (the 8-byte length and {f.header_bytes - 8:,} bytes of JSON)"
        yield f"metadata    {_metadata_text(f.metadata)}"
    else:
        yield f"headers     {report.header_bytes:,} bytes in all (the 8-byte length and the JSON of each)"
        if same_metadata:
            yield f"metadata    {_metadata_text(files[0].metadata)} (every shard)"
    width = max(len(d.code) for d in report.dtypes) if report.dtypes else 0
    for i, d in enumerate(report.dtypes):
        label = "dtypes" if i == 0 else ""
        tensors = counted(d.tensors, "tensor")
        yield f"{label:<12}{d.code:<{width}}  {tensors:>14}  {human(d.nbytes):>11}  ({d.nbytes:,} bytes)"
    yield from _alignment_text(report)
    if report.entries:
        name, entry = max(report.entries.items(), key=lambda item: item[1].nbytes)
        yield f"largest     {name}: {DTYPE_CODES[entry.dtype]} {list(entry.shape)}, {human(entry.nbytes)}"
    if len(files) > 1:
        yield "shards"
        for f in files:
            line = f"  {f.path.name}: {counted(f.tensors, 'tensor')}, {human(f.nbytes)}, header {f.header_bytes:,} B"
            yield line + ("" if same_metadata else f", metadata {_metadata_text(f.metadata)}")
    if report.fit is not None:
        yield from _fit_text(report.fit, report.model)
    if list_tensors:
        yield "tensor list (name, dtype, shape, offset in its file, bytes)"
        for name, entry in report.entries.items():
            yield f"  {name}  {DTYPE_CODES[entry.dtype]}  {list(entry.shape)}  {entry.start:,}  {entry.nbytes:,}"


def _alignment_text(report: CheckpointReport) -> Iterator[str]:
    bad = report.misaligned
    if not bad:
        yield "alignment   every tensor starts at a multiple of its item size: all map without a copy"
        return
    nbytes = sum(report.entries[name].nbytes for name in bad)
    yield (f"alignment   {counted(len(bad), 'tensor')} {is_are(len(bad))} at an offset that is not a multiple of "
           f"its item size and would be copied ({human(nbytes)}; rewrite the file with "
           f"`python -m weightmap convert` to map them):")
    for name in bad[:_LISTED]:
        entry = report.entries[name]
        yield f"              {name}: {DTYPE_CODES[entry.dtype]} at offset {entry.start:,}"
    if len(bad) > _LISTED:
        yield f"              ... and {len(bad) - _LISTED} more"


def _fit_text(fit: MappingPreview, model: str | None) -> Iterator[str]:
    yield f"model       {model or 'the model'}: what map_weights would do (no weight read)"
    mapped = len(fit.mapped)
    yield f"  map       {counted(mapped, 'tensor')}, {human(fit.nbytes)} as views of the file, no copy"
    if fit.copied:
        yield f"  copy      {counted(len(fit.copied), 'tensor')}, {human(fit.copied_bytes)} of new memory:"
        for name, why in list(fit.copied.items())[:_LISTED]:
            yield f"              {name}: {why}"
        if len(fit.copied) > _LISTED:
            yield f"              ... and {len(fit.copied) - _LISTED} more"
    else:
        yield "  copy      none"
    yield f"  missing   {_names(fit.missing) if fit.missing else 'none'}"
    if fit.still_meta:
        yield f"  on meta   {counted(len(fit.still_meta), 'tensor')} left on the meta device: {_names(fit.still_meta)}"
    else:
        yield "  on meta   none left on the meta device"
    if fit.computed:
        yield (f"  computed  {counted(len(fit.computed), 'non-persistent buffer')} as the model computed "
               f"{'it' if len(fit.computed) == 1 else 'them'}: {_names(fit.computed)}")
    if fit.unused:
        yield f"  unused    {counted(len(fit.unused), 'checkpoint tensor')} no model tensor takes: {_names(fit.unused)}"
    if fit.strict_problems:
        n = len(fit.strict_problems)
        yield f"  strict    map_weights(strict=True) would refuse: {counted(n, 'problem')}"
        for problem in fit.strict_problems[:_LISTED]:
            yield f"              {problem}"
        if n > _LISTED:
            yield f"              ... and {n - _LISTED} more"
    else:
        yield "  strict    map_weights(strict=True) would pass"


def _json(report: CheckpointReport) -> dict[str, Any]:
    data: dict[str, Any] = {
        "source": str(report.source),
        "index": None if report.index is None else str(report.index),
        "size": report.size,
        "nbytes": report.nbytes,
        "header_bytes": report.header_bytes,
        "files": [
            {"path": str(f.path), "size": f.size, "header_bytes": f.header_bytes, "tensors": f.tensors,
             "nbytes": f.nbytes, "metadata": f.metadata}
            for f in report.files
        ],
        "dtypes": [{"dtype": d.code, "tensors": d.tensors, "nbytes": d.nbytes} for d in report.dtypes],
        "misaligned": report.misaligned,
        "tensors": {
            name: {"dtype": DTYPE_CODES[e.dtype], "shape": list(e.shape), "offset": e.start, "nbytes": e.nbytes}
            for name, e in report.entries.items()
        },
    }
    fit = report.fit
    if fit is not None:
        data["model"] = {
            "name": report.model,
            "mapped": fit.mapped,
            "copied": fit.copied,
            "missing": fit.missing,
            "still_meta": fit.still_meta,
            "computed": fit.computed,
            "unused": fit.unused,
            "nbytes": fit.nbytes,
            "copied_bytes": fit.copied_bytes,
            "strict_problems": fit.strict_problems,
        }
    return data

