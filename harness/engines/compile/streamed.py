"""Packaged AOTInductor engines whose weights are streamed into the artifact from the partition's own tensors.

AOTInductor's own packaging (``weights = "packaged_compiler"``) serializes every constant into one buffer
in memory, compiles or writes it, and packages by reading whole files: several copies of the partition's
weights while one engine is written. Here the engine is compiled with its weights left out, and the
weights are written into the artifact by :func:`write_blob`, a chunk at a time, straight from the tensors
the partition already has (for a mapped model, the mapped views):

1. **Compile without the weights** (:func:`compile_without_weights`): ``package_constants_in_so=False``
   with the engine built to read an external weights blob (``USE_MMAP_EXTERNAL``). torch 2.13 builds an
   engine so only when it serializes that blob itself (``package_constants_on_disk_format="binary_blob"``),
   so while the compiler runs ``torch._inductor.codecache.determine_aoti_mmap_flags`` answers "external
   blob" with nothing serialized: the generated code and the linker see no weight.
2. **The blob's layout** (:func:`blob_layout`) is read from the generated wrapper, which is what the
   engine's loader follows: every constant not folded at run time, in ``constants_info_`` order, each
   its storage's bytes padded to its ``data_size``.
3. **The blob's size** is written into the 8 bytes the engine reserves for it
   (``_binary_constants_bin_start``, :func:`record_blob_size`); torch's loader maps that many bytes of
   the blob.
4. **The archive** is torch's own (``package_aoti``) without the blob, which :func:`write_blob` then
   appends as a stored zip entry named as torch names it (``<wrapper>_weights.blob``). It is read with
   the tensors' bytes viewed in place (no copy), each chunk's source pages dropped once written
   (:func:`weightmap.release_mapped_storage`, for mapped tensors), and the written pages flushed and
   dropped from the page cache behind the writer.

The artifact is self-contained: ``torch._inductor.aoti_load_package`` loads it and maps the blob.
What that loader then does with it (torch 2.13): it extracts the archive into a temporary directory
(the blob is written out again, to disk), maps the extracted blob and copies every constant into
memory it allocates (``load_constants`` with ``skip_copy = false``), then unmaps it: the loaded engine
holds one anonymous copy of its weights.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import struct
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.engines.compile.compiler import EngineBuildError
from harness.measure.coldcache import write_back_and_drop
from harness.measure.procfs import read_status
from harness.units import MIB

__all__ = [
    "BLOB_SIZE_SYMBOL",
    "packaged_weights_missing",
    "BlobEntry",
    "BlobWriteStats",
    "blob_layout",
    "compile_without_weights",
    "package_streamed",
    "record_blob_size",
    "write_blob",
]

BLOB_SIZE_SYMBOL = "_binary_constants_bin_start"
"""The engine's 8 bytes that hold its external blob's size (``USE_MMAP_EXTERNAL`` builds)."""
_EXTERNAL_MACRO = "USE_MMAP_EXTERNAL"
_CHUNK_BYTES = 16 * MIB  # the source pages resident at once while an engine is written
_INFO_LINE = re.compile(r"^\s*constants_info_\[(\d+)\]\.(\w+)\s*=\s*(.*?);\s*$")


@contextlib.contextmanager
def _external_blob_without_serializing() -> Iterator[None]:
    """While the block runs, torch's compiler builds engines that read an external blob and serializes none."""
    from torch._inductor import codecache

    original = codecache.determine_aoti_mmap_flags

    def external(consts_size: int) -> tuple[bool, bool]:
        return True, False  # (use_external_weights, use_mmap_weights)

    codecache.determine_aoti_mmap_flags = external  # type: ignore[assignment]
    try:
        yield
    finally:
        codecache.determine_aoti_mmap_flags = original  # type: ignore[assignment]


def compile_without_weights(program: torch.export.ExportedProgram, configs: Mapping[str, Any]) -> list[str]:
    """AOTInductor's generated files for ``program`` (``aot_compile`` with ``aot_inductor.package``), no weight in them.

    The engine is built to read its weights from an external blob that nothing has written yet
    (the empty ``*_weights.blob`` among the files). ``configs`` are further inductor settings; the
    weight settings are this function's. ``EngineBuildError`` when this torch builds the engine
    otherwise (the wrapper's compile command does not define ``USE_MMAP_EXTERNAL``).
    """
    options = dict(configs)
    options["aot_inductor.package"] = True
    options["aot_inductor.package_constants_in_so"] = False
    options["aot_inductor.package_constants_on_disk_format"] = None
    args, kwargs = program.example_inputs
    with _external_blob_without_serializing():
        files = torch._inductor.aot_compile(program.module(check_guards=False), args, kwargs, options=options)
    if not isinstance(files, list):
        raise EngineBuildError(f"AOTInductor returned {type(files).__name__}, not the list of its generated files")
    paths = [f for f in files if isinstance(f, str)]
    wrapper = _one(paths, ".wrapper.cpp")
    if not re.search(rf"-D\s*{_EXTERNAL_MACRO}\b", Path(wrapper).read_text()):
        raise EngineBuildError(
            f"{Path(wrapper).name}: this torch ({torch.__version__}) did not build the engine to read an external "
            f"weights blob ({_EXTERNAL_MACRO} is not in its compile command); use weights = \"packaged_compiler\""
        )
    return [str(f) for f in files]


def _one(paths: Sequence[str], suffix: str) -> str:
    found = [p for p in paths if p.endswith(suffix)]
    if len(found) != 1:
        raise EngineBuildError(f"AOTInductor generated {len(found)} files ending in {suffix}, expected one: {found}")
    return found[0]


@dataclass(frozen=True)
class BlobEntry:
    """One constant's place in an engine's external blob, as the generated wrapper lays it out.

    ``name``: the engine's name for it; ``fqn``: the program's (the partition tensor's name);
    ``data_size``: the bytes it takes in the blob (its storage's bytes, padded); ``offset``: its
    storage offset in elements.
    """

    index: int
    name: str
    fqn: str
    data_size: int
    offset: int


def blob_layout(wrapper_cpp: str | os.PathLike[str]) -> list[BlobEntry]:
    """The external blob's entries in order, read from the generated wrapper's ``constants_info_`` lines.

    Constants folded at run time (``from_folded = true``) are not in the blob and are left out.
    ``EngineBuildError`` naming the file when a constant lacks one of the fields the layout needs.
    """
    path = Path(wrapper_cpp)
    fields: dict[int, dict[str, str]] = {}
    for line in path.read_text().splitlines():
        m = _INFO_LINE.match(line)
        if m:
            fields.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
    entries = []
    for index in sorted(fields):
        f = fields[index]
        missing = [k for k in ("name", "original_fqn", "data_size", "offset", "from_folded") if k not in f]
        if missing:
            raise EngineBuildError(f"{path.name}: constants_info_[{index}] has no {', '.join(missing)}")
        if f["from_folded"] == "true":
            continue
        entries.append(
            BlobEntry(index, _unquote(f["name"]), _unquote(f["original_fqn"]), int(f["data_size"]), int(f["offset"]))
        )
    return entries


def _unquote(text: str) -> str:
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text


def packaged_weights_missing(weights: str) -> str | None:
    """Why engines with ``weights`` cannot be built here: a ``packaged`` engine's blob size is written into its
    shared library with pyelftools (:func:`record_blob_size`), which does not import; None when they can (and for
    any other setting)."""
    if weights != "packaged":
        return None
    try:
        import elftools.elf.elffile  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything
        return (f"needs pyelftools, which writes each engine's weights size into it ({type(exc).__name__}: {exc}); "
                "install it (pip install pyelftools; it is in the harness extra) or use weights = "
                "\"packaged_compiler\"")
    return None


def record_blob_size(shared_library: str | os.PathLike[str], size: int) -> None:
    """Write ``size`` into the engine's :data:`BLOB_SIZE_SYMBOL` (8 bytes that the compiler left at 0).

    ``EngineBuildError`` naming the file when the symbol is missing, is not 8 bytes of file data, or
    does not hold 0 (an engine built otherwise than :func:`compile_without_weights` builds it).
    """
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    path = Path(shared_library)
    with open(path, "r+b") as fh:
        elf = ELFFile(fh)
        symtab = elf.get_section_by_name(".symtab")
        if not isinstance(symtab, SymbolTableSection):
            raise EngineBuildError(f"{path.name}: no symbol table, so the blob's size cannot be recorded")
        start = symtab.get_symbol_by_name(BLOB_SIZE_SYMBOL)
        end = symtab.get_symbol_by_name(BLOB_SIZE_SYMBOL.replace("_start", "_end"))
        if not start or not end:
            raise EngineBuildError(f"{path.name}: no {BLOB_SIZE_SYMBOL} symbol, so the blob's size cannot be recorded")
        value, section_index = start[0]["st_value"], start[0]["st_shndx"]
        if end[0]["st_value"] - value != 8 or not isinstance(section_index, int):
            raise EngineBuildError(f"{path.name}: {BLOB_SIZE_SYMBOL} is not the 8 bytes of an external blob's size")
        section = elf.get_section(section_index)
        if section["sh_type"] != "SHT_PROGBITS":
            raise EngineBuildError(f"{path.name}: {BLOB_SIZE_SYMBOL} lies in {section.name}, which has no file data")
        offset = section["sh_offset"] + value - section["sh_addr"]
        fh.seek(offset)
        if fh.read(8) != struct.pack("q", 0):
            raise EngineBuildError(f"{path.name}: {BLOB_SIZE_SYMBOL} already holds a size; was it built with weights?")
        fh.seek(offset)
        fh.write(struct.pack("q", size))


@dataclass(frozen=True)
class BlobWriteStats:
    """What :func:`write_blob` wrote: ``nbytes`` in the blob, ``chunks`` written, ``released``: chunks whose
    source pages were dropped (mapped tensors only); and this process's memory meanwhile, read after each
    chunk was written (before its pages were dropped, when the most is resident): ``rss_start_bytes``, RSS
    when the write began; ``peak_rss_bytes``, the largest RSS read; ``peak_read_bytes``, the largest rise of
    file-backed RSS over the start (the source's mapped pages resident at once: the weights read, with the
    pages of any code the write runs for the first time, a few hundred KiB)."""

    nbytes: int
    chunks: int
    released: int
    rss_start_bytes: int = 0
    peak_rss_bytes: int = 0
    peak_read_bytes: int = 0


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over a storage's bytes (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _view(host: torch.Tensor) -> memoryview:
    """The bytes of a contiguous uint8 CPU tensor, viewed in place.

    Not ``numpy()``: a storage that numpy has viewed can no longer be resized, and the
    compiler's copies of the weights are freed by resizing them.
    """
    return memoryview((ctypes.c_char * host.numel()).from_address(host.data_ptr())).cast("B")


def _aligned_extra(header_offset: int, name: str, align: int) -> bytes:
    """A local-header extra field that puts an entry's data on an ``align``-byte boundary.

    The local header is 30 bytes, the name, the extra field; a ZIP64 entry adds its own 20-byte
    field. The padding is a field of id 0xD935 (zipalign's), which readers skip.
    """
    fixed = header_offset + 30 + len(name.encode()) + 20 + 4  # + the padding field's id and size
    pad = (-fixed) % align
    return struct.pack("<HH", 0xD935, pad) + b"\0" * pad


def write_blob(
    archive: str | os.PathLike[str],
    member: str,
    layout: Sequence[BlobEntry],
    tensors: Mapping[str, torch.Tensor],
    *,
    chunk_bytes: int = _CHUNK_BYTES,
    align: int = 4096,
) -> BlobWriteStats:
    """Append ``member`` to the zip ``archive``: the bytes of ``tensors`` laid out as ``layout`` says, stored.

    Each entry's tensor (by ``fqn``) must have storage offset ``offset`` and a storage of at most
    ``data_size`` bytes; the rest of its ``data_size`` is zeros. Bytes are viewed in place and written
    ``chunk_bytes`` at a time (a GPU tensor's chunk is copied to the host first); after each chunk a
    mapped storage's pages are dropped and the archive's written pages flushed and dropped from the
    page cache. The entry's data starts on an ``align``-byte boundary, so that it can be mapped.
    ``EngineBuildError`` naming the archive and the constant for a tensor missing or laid out otherwise.

    It appends to the archive torch's package writer made, in place, not through the harness's atomic
    writer (:mod:`harness.fileio.atomic`): streaming the weights into a copy would write them twice, and the
    archive is an engine, scratch of one run, removed when the run ends.
    """
    from weightmap import release_mapped_storage

    path = Path(archive)
    problems = []
    for entry in layout:
        t = tensors.get(entry.fqn)
        if t is None:
            problems.append(f"{entry.fqn}: the engine needs it but the partition has no such tensor")
        elif t.storage_offset() != entry.offset or t.untyped_storage().nbytes() > entry.data_size:
            problems.append(
                f"{entry.fqn}: built for storage offset {entry.offset} and {entry.data_size} bytes, the tensor has "
                f"{t.storage_offset()} and {t.untyped_storage().nbytes()}"
            )
    if problems:
        raise EngineBuildError(f"{path.name}: cannot write the engine's weights: " + "; ".join(problems))
    chunks = released = total = 0
    begun = read_status()
    peak_rss, peak_read = begun.rss_bytes, 0
    with zipfile.ZipFile(path, "a", allowZip64=True) as zf:
        assert zf.fp is not None
        info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_STORED
        info.extra = _aligned_extra(zf.start_dir, member, align)
        with zf.open(info, "w", force_zip64=True) as out:
            fd = zf.fp.fileno()
            for entry in layout:
                storage = tensors[entry.fqn].untyped_storage()
                data = _bytes_of(storage)
                for start in range(0, storage.nbytes(), chunk_bytes):
                    piece = data[start : start + chunk_bytes]
                    host = piece.cpu() if piece.device.type != "cpu" else piece
                    out.write(_view(host))
                    chunks += 1
                    now = read_status()
                    peak_rss = max(peak_rss, now.rss_bytes)
                    peak_read = max(peak_read, now.file_bytes - begun.file_bytes)
                    if release_mapped_storage(storage):
                        released += 1
                    zf.fp.flush()
                    write_back_and_drop(fd)
                pad = entry.data_size - storage.nbytes()
                if pad:
                    out.write(bytes(pad))
                total += entry.data_size
        zf.fp.flush()
        write_back_and_drop(zf.fp.fileno())
    return BlobWriteStats(total, chunks, released, begun.rss_bytes, peak_rss, peak_read)


def package_streamed(
    files: Sequence[str],
    package_path: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
) -> BlobWriteStats:
    """Package the files of :func:`compile_without_weights` into ``package_path`` with the weights of ``tensors``.

    Records the blob's size in the engine, writes the archive with torch's package writer without
    the (empty) blob, then streams the blob in (:func:`write_blob`).
    """
    from torch._inductor.package import package_aoti

    wrapper = _one(files, ".wrapper.cpp")
    shared = _one(files, ".wrapper.so")
    blob = _one(files, "_weights.blob")
    layout = blob_layout(wrapper)
    size = sum(e.data_size for e in layout)
    if not size:
        raise EngineBuildError(f"{Path(wrapper).name}: the engine reads no weight from its blob, and torch's loader "
                               "cannot map an empty one; package it with the compiler")
    record_blob_size(shared, size)
    out = Path(package_path)
    package_aoti(str(out), [f for f in files if f != blob])
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
    so_member = _one(names, ".wrapper.so")
    member = f"{so_member.rsplit('/', 1)[0]}/{Path(blob).name}"
    return write_blob(out, member, layout, tensors)
