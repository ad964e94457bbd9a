"""The mapping rules: how a model's tensors become views of a checkpoint.

:func:`map_weights` works in three steps, and only the last one touches the model:

1. *resolve*: open every file of the checkpoint once (it must be a regular
   file), read and validate its header from that descriptor, find each
   tensor's checkpoint entry, check that the model's tensor can be replaced
   at all (a plain dense tensor or ``Parameter``: not a subclass, not sparse,
   quantized or nested), check shapes and dtypes, decide per tensor whether it
   is mapped, copied or missing. Any error is raised here, so an error leaves the model
   exactly as it was;
2. *materialise*: map the descriptors that were validated (after checking that
   each file still has the size, modification time and header that were
   validated), copy-on-write and, on Linux, ``MAP_NORESERVE`` (see
   :mod:`weightmap.registry`: a checkpoint larger than RAM + swap maps), then
   make one ``torch.frombuffer`` view per tensor (no read, no copy), plus the
   copies that are unavoidable (a dtype cast, an offset that is not a multiple
   of the item size). An entry that several untied tensors take (``key_map``)
   is viewed through one more mapping of its file per extra tensor, so that each
   has pages of its own once written; the other views of a storage tie are made
   on their base's new tensor. The descriptors are closed when this step ends;
3. *assign*: put each new tensor into every slot that held the old one, so ties
   stay ties. A tensor on the meta device is replaced (a ``Parameter`` by a new
   ``Parameter``, a buffer on the same storage by the plain tensor); a real one
   keeps its object and gets ``.data = view``. If an
   assignment fails anyway, the ones already made are undone before the
   :class:`MappingError` is raised.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from weightmap.checkpoint import Checkpoint, open_checkpoint
from weightmap.errors import MappingError
from weightmap.format import Header, TensorEntry, check_little_endian
from weightmap.pagecache import read_and_forget, readonly_view
from weightmap.runnable import meta_buffer_problem
from weightmap.storageties import Geometry, bits, covers_storage, disjoint, equal_in_chunks, storage_groups
from weightmap.targets import Target, collect_targets
from weightmap.text import SHOWN, counted, names_shown

__all__ = ["MappedWeights", "MappingPreview", "map_weights", "preview_mapping"]


KeyMap = Mapping[str, str] | Callable[[str], "str | None"]


@dataclass
class MappedWeights:
    """What :func:`map_weights` did, and the handle that keeps the mappings alive.

    Attributes (all names are the model's, not the checkpoint's):
        mapped: tensors that are now zero-copy views of the checkpoint.
        copied: tensors that had to be copied (dtype cast, misaligned offset).
        missing: persistent tensors the checkpoint does not hold.
        still_meta: every tensor still on the meta device afterwards (missing
            persistent tensors, and non-persistent buffers built on meta): the model
            cannot run until they are filled. Empty for a model built under
            :func:`weightmap.init_empty_weights` whose checkpoint holds every
            persistent tensor.
        paths: the files that were mapped.
        nbytes: the bytes of the checkpoint that the views cover, each entry once
            (a tie, and an entry that ``key_map`` gives several tensors, count once):
            what the page cache holds for them once every view was read. The
            process's RSS can be more: an entry that several untied tensors take is
            mapped once per tensor, and each mapping that reads a page counts it.

    ``close()`` (or leaving a ``with`` block) drops only this handle's
    references: the weights stay mapped, and releasable, for as long as a
    tensor uses them, and each file is unmapped when its last view goes.

    ``repr()`` is a one-line summary of counts and bytes, whatever the model's
    size; it reads no weight, so it faults no page in.
    """

    mapped: list[str]
    copied: list[str]
    missing: list[str]
    still_meta: list[str]
    paths: list[Path]
    nbytes: int
    _maps: list[mmap.mmap]

    def close(self) -> None:
        """Drop the handle's references to the mappings (never unmaps under a live view)."""
        self._maps = []

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return not self._maps

    def __enter__(self) -> MappedWeights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"MappedWeights(mapped={len(self.mapped)}, copied={len(self.copied)}, "
            f"missing={len(self.missing)}, still_meta={len(self.still_meta)}, "
            f"nbytes={self.nbytes}, files={len(self.paths)})"
        )


@dataclass
class _Plan:
    """The decision for one target, made before anything changes."""

    target: Target
    header: Header | None = None
    entry: TensorEntry | None = None
    copy_reason: str | None = None  # set when the tensor cannot be a view
    computed: bool = False  # a real non-persistent buffer: the model computed it, it is left alone
    # The other entries of a tie that the checkpoint holds under other names: (model name, header, entry).
    twins: list[tuple[str, Header, TensorEntry]] = field(default_factory=list)
    # Another view of the storage of ``base``'s tensor (a storage tie): it becomes that view of base's new tensor.
    base: _Plan | None = None
    geometry: Geometry | None = None
    # Which copy-on-write mapping of its file the view is made on: 0, or k when k earlier tensors take its entry.
    mapping: int = 0

    @property
    def found(self) -> bool:
        """The tensor gets a new value: from its own entry, or as a view of its storage tie's base."""
        return self.entry is not None or self.base is not None

    @property
    def source(self) -> tuple[Header, TensorEntry]:
        """The entry the tensor's storage comes from: its own, or its base's."""
        plan = self.base if self.base is not None else self
        assert plan.header is not None and plan.entry is not None
        return plan.header, plan.entry

    @property
    def meta_buffer(self) -> bool:
        """A non-persistent buffer on meta that the checkpoint does not hold: the model cannot run."""
        target = self.target
        return not self.found and not target.persistent and target.tensor.device.type == "meta"

    @property
    def entry_names(self) -> list[str]:
        """The checkpoint names this plan takes: its own entry's and its twins'."""
        own = [self.entry.name] if self.entry is not None else []
        return own + [entry.name for _, _, entry in self.twins]


def _key_function(key_map: KeyMap | None) -> Callable[[str], str | None]:
    if key_map is None:
        return lambda name: name
    if isinstance(key_map, Mapping):
        table = key_map
        return lambda name: table.get(name, name)
    if callable(key_map):
        return key_map
    raise TypeError(f"key_map must be a dict or a callable, not {type(key_map).__name__}")


def _lookup(target: Target, keys: Callable[[str], str | None], checkpoint: Checkpoint) -> _Plan:
    """The checkpoint entry of the target's first name that the checkpoint holds, and any other
    entries its tied names find (checked against it by :func:`_check_twins`).

    A real non-persistent buffer is the model's own (its ``__init__`` computed it, as under
    :func:`weightmap.init_empty_weights`): it is left alone even when the checkpoint holds a
    tensor of that name (BERT checkpoints hold ``position_ids``).
    """
    if not target.persistent and target.tensor.device.type != "meta":
        return _Plan(target, computed=True)
    plan = _Plan(target)
    for name in target.names:
        key = keys(name)
        if key is None or key not in checkpoint.entries:
            continue
        header, entry = checkpoint.entries[key]
        if plan.entry is None:
            plan.header, plan.entry = header, entry
        elif all(entry is not other for other in (plan.entry, *(e for _, _, e in plan.twins))):
            plan.twins.append((name, header, entry))
    return plan


def _unreplaceable(tensor: torch.Tensor) -> str | None:
    """Why a view of the file cannot take this tensor's place (None when it can).

    Only a plain dense tensor or ``Parameter`` can be replaced by (or given the data of)
    a ``torch.frombuffer`` view: a subclass, a sparse, quantized or nested tensor would
    either refuse ``.data = view`` or silently lose what makes it what it is.
    """
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        kind = type(tensor)
        return (
            f"is a {kind.__module__}.{kind.__qualname__}, a tensor subclass: only plain tensors and "
            "Parameters can be replaced by views of the file"
        )
    if tensor.is_nested:
        return "is a nested tensor: only dense tensors can be views of the file"
    if tensor.layout != torch.strided:
        return f"has layout {tensor.layout}: only dense (torch.strided) tensors can be views of the file"
    if tensor.is_quantized:
        return f"is quantized ({tensor.dtype}): only unquantized tensors can be views of the file"
    return None


def _check_replaceable(plan: _Plan) -> None:
    header, entry = plan.source
    reasons = [_unreplaceable(tensor) for tensor in plan.target.objects]
    reason = next((r for r in reasons if r is not None), None)
    if reason is not None:
        raise MappingError(
            f"{header.path}: tensor {entry.name!r} (model name {plan.target.names[0]!r}): "
            f"the model's tensor {reason}. The model was left unchanged."
        )


def _check_shape(plan: _Plan) -> None:
    assert plan.entry is not None and plan.header is not None
    want = tuple(plan.target.tensor.shape)
    for model_name, header, entry in [(plan.target.names[0], plan.header, plan.entry), *plan.twins]:
        if entry.shape != want:
            raise MappingError(
                f"{header.path}: tensor {entry.name!r} (model name {model_name!r}) "
                f"has shape {list(entry.shape)} in the checkpoint but {list(want)} in the model: "
                "shapes must match"
            )


def _tie_storages(plans: list[_Plan]) -> None:
    """Make every storage tie of different views one storage again, or refuse it (the rule is in map_weights).

    The tensor that is its whole storage and whose entry the checkpoint holds is the base: it is
    mapped, and every other tensor of the storage becomes the same view of the base's new tensor.
    """
    for group in storage_groups([plan.target.tensor for plan in plans]):
        members = [plans[i] for i in group]
        held = [m for m in members if m.entry is not None]
        if not held:
            continue  # the checkpoint holds none of them: all missing, the tie unchanged
        base = next((m for m in held if covers_storage(m.target.tensor)), None)
        tensors = [m.target.tensor for m in members]
        if base is None and len({t.dtype for t in tensors}) == 1 and disjoint(tensors):
            continue  # slices that share no item (a fused weight split): independent, mapped one by one
        if base is None:
            raise _unheld_base_error(held[0], next((m for m in members if covers_storage(m.target.tensor)), None))
        for member in members:
            if member is base:
                continue
            if member.target.tensor.dtype != base.target.tensor.dtype:
                header, _ = base.source
                raise MappingError(
                    f"{header.path}: tensors {base.target.names[0]!r} and {member.target.names[0]!r} share one "
                    f"storage in the model with dtypes {base.target.tensor.dtype} and {member.target.tensor.dtype}: "
                    "a storage tie maps only when its tensors have one dtype. The model was left unchanged."
                )
            member.base, member.geometry = base, Geometry.of(member.target.tensor)
            member.computed = False  # a buffer on the storage changes with it, as load_state_dict changes it
            member.copy_reason = base.copy_reason


def _unheld_base_error(held: _Plan, whole: _Plan | None) -> MappingError:
    assert held.header is not None and held.entry is not None
    name = held.target.names[0]
    if whole is None:
        missing = "none of the tensors on that storage is the whole storage (contiguous, from its first item)"
        other = "another tensor"
    else:
        missing = f"the checkpoint does not hold {whole.target.names[0]!r}, the tensor that is the whole storage"
        other = repr(whole.target.names[0])
    return MappingError(
        f"{held.header.path}: tensor {held.entry.name!r} (model name {name!r}) shares one storage with {other} "
        f"in the model, with another view of it, and {missing}: a mapped storage is one range of the file, so a "
        "storage tie maps from the entry of the tensor that is the whole storage, and the other names the "
        "checkpoint holds must hold their views of it. Write the checkpoint with save_weights_for_mapping "
        "(every tensor of the model, the whole storage included). The model was left unchanged."
    )


@dataclass(frozen=True)
class _Check:
    """One entry that must hold what another holds: ``other`` must be ``view`` of ``first`` (None: ``first`` itself)."""

    plan: _Plan
    first: tuple[Header, TensorEntry]
    view: Geometry | None
    other: tuple[str, Header, TensorEntry]  # its model name, its file's header, the entry


def _checks(plans: list[_Plan]) -> list[_Check]:
    """What a tie held under several checkpoint names must agree on, entry by entry."""
    checks = []
    for plan in plans:
        if plan.base is not None:
            own = [(plan.target.names[0], plan.header, plan.entry)] if plan.entry is not None else []
            others = [*own, *plan.twins]
            checks += [_Check(plan, plan.source, plan.geometry, (n, h, e)) for n, h, e in others if h is not None]
        elif plan.entry is not None:
            checks += [_Check(plan, plan.source, None, twin) for twin in plan.twins]
    return checks


def _holds(check: _Check, maps: dict[Path, mmap.mmap]) -> bool:
    (header, entry), (_, other_header, other) = check.first, check.other
    if entry.dtype != other.dtype:
        return False
    if check.view is None and (entry.shape != other.shape or entry.numel == 0):
        return entry.shape == other.shape
    kind = bits(entry.dtype)
    first = readonly_view(maps[header.path], kind, entry.numel, entry.start).view(entry.shape)
    second = readonly_view(maps[other_header.path], kind, other.numel, other.start).view(other.shape)
    return equal_in_chunks(first if check.view is None else check.view.on(first), second)


def _check_entries(checks: list[_Check], checkpoint: Checkpoint) -> None:
    """Every check holds, or the first that does not raises; the page cache is left as it was.

    The entries are read through read-only mappings, ``CHUNK_BYTES`` at a time, and the pages the
    reads brought into the page cache are dropped afterwards (:func:`weightmap.pagecache.read_and_forget`).
    """
    if not checks:
        return
    headers = {h.path: h for c in checks for h in (c.first[0], c.other[1])}
    with contextlib.ExitStack() as stack:
        maps = {
            path: stack.enter_context(read_and_forget(checkpoint.file(h).fd, h.file_size))
            for path, h in headers.items()
        }
        failed = next((check for check in checks if not _holds(check, maps)), None)
    if failed is not None:
        raise _disagreement(failed)


def _disagreement(check: _Check) -> MappingError:
    (header, entry), (model_name, other_header, other) = check.first, check.other
    held = f"dtype {other.dtype} against {entry.dtype}" if other.dtype != entry.dtype else "other bytes"
    names = check.plan.target.names
    if check.view is None:
        return MappingError(
            f"{other_header.path}: tensors {entry.name!r} and {other.name!r} are one tied tensor in the model "
            f"(model names {names_shown(names)}) but the checkpoint holds different values for them "
            f"({other.name!r} holds {held} than {entry.name!r}, in {header.path}): a mapped tensor "
            "holds one value only (load_state_dict would keep the value of the last of these names in "
            "state_dict order). Pass "
            f"key_map to say which checkpoint tensor every tied name takes, or write the checkpoint with "
            "save_weights_for_mapping (one entry per tie). The model was left unchanged."
        )
    assert check.plan.base is not None
    base = check.plan.base.target.names[0]
    return MappingError(
        f"{other_header.path}: tensors {base!r} and {model_name!r} share one storage in the model "
        f"({model_name!r} is the view {check.view} of it), but the checkpoint's {other.name!r} does not hold that "
        f"view of {entry.name!r} ({held}, in {header.path}): a mapped storage holds one value only "
        "(load_state_dict would copy both into the storage, the later name winning). Write the checkpoint with "
        "save_weights_for_mapping, or pass key_map. The model was left unchanged."
    )


def _number_mappings(plans: list[_Plan]) -> None:
    """Give the k-th view of one entry the k-th copy-on-write mapping of its file, so that views are independent."""
    taken: dict[tuple[Path, int], int] = {}
    for plan in plans:
        if plan.base is None and plan.entry is not None and plan.entry.numel and not plan.copy_reason:
            assert plan.header is not None
            key = (plan.header.path, plan.entry.start)
            plan.mapping = taken.get(key, 0)
            taken[key] = plan.mapping + 1


def _view_bytes(plans: list[_Plan]) -> int:
    """Bytes of the file that the views cover, each entry once."""
    covered = {
        (plan.header.path, plan.entry.start): plan.entry.nbytes
        for plan in plans
        if plan.base is None and plan.header is not None and plan.entry is not None and not plan.copy_reason
    }
    return sum(covered.values())


def _copy_reason(plan: _Plan) -> str | None:
    assert plan.entry is not None
    entry, tensor = plan.entry, plan.target.tensor
    if entry.dtype != tensor.dtype:
        return f"dtype {entry.dtype} in the checkpoint, {tensor.dtype} in the model: cast into new memory"
    if entry.numel and entry.start % entry.dtype.itemsize:
        return (
            f"offset {entry.start} is not a multiple of its item size {entry.dtype.itemsize} "
            "(a file from an old writer): copied into aligned memory"
        )
    return None


def _strict_problems(plans: list[_Plan]) -> list[str]:
    """Every persistent tensor that ``strict=True`` refuses, one line each."""
    problems = []
    for plan in plans:
        target = plan.target
        if not plan.found and target.persistent:
            problems.append(f"{target.names[0]!r}: missing from the checkpoint")
        elif plan.found and plan.copy_reason:
            _, entry = plan.source
            stored = "" if entry.name == target.names[0] else f" (checkpoint {entry.name!r})"
            problems.append(f"{target.names[0]!r}{stored}: {plan.copy_reason}")
    return problems


def _meta_buffer_names(plans: list[_Plan]) -> list[str]:
    return [plan.target.names[0] for plan in plans if plan.meta_buffer]


def _strict_error(source: Path, problems: list[str]) -> MappingError:
    n = len(problems)
    shown = "\n  ".join(problems[:SHOWN])
    more = f"\n  ... and {n - SHOWN} more" if n > SHOWN else ""
    return MappingError(
        f"{source}: strict=True requires every persistent tensor to be mapped without a copy; "
        f"{counted(n, 'problem')}:\n  {shown}{more}\nThe model was left unchanged."
    )


def _resolve(targets: list[Target], checkpoint: Checkpoint, keys: Callable[[str], str | None]) -> list[_Plan]:
    """Decide every target; shape, kind and tie errors raise here, before any change.

    Decided from the headers alone, except a tie found under several checkpoint names,
    whose entries are read and compared (:func:`_check_entries`).
    """
    plans = []
    for target in targets:
        plan = _lookup(target, keys, checkpoint)
        if plan.found:
            _check_replaceable(plan)
            _check_shape(plan)
            plan.copy_reason = _copy_reason(plan)
        plans.append(plan)
    _tie_storages(plans)
    for plan in plans:
        if plan.base is not None and plan.entry is None:
            _check_replaceable(plan)
    _number_mappings(plans)
    _check_entries(_checks(plans), checkpoint)
    return plans


def _view(mm: mmap.mmap, entry: TensorEntry) -> torch.Tensor:
    """A zero-copy view of one entry: nothing is read until the tensor is used."""
    return torch.frombuffer(mm, dtype=entry.dtype, count=entry.numel, offset=entry.start).view(entry.shape)


def _materialise(plan: _Plan, maps: dict[tuple[Path, int], mmap.mmap]) -> torch.Tensor:
    entry, header = plan.entry, plan.header
    assert entry is not None and header is not None
    want = plan.target.tensor.dtype
    if entry.numel == 0:
        return torch.empty(entry.shape, dtype=want)
    mm = maps[(header.path, plan.mapping)]
    if entry.start % entry.dtype.itemsize:  # misaligned: copy the bytes into aligned memory first
        raw = torch.frombuffer(mm, dtype=torch.uint8, count=entry.nbytes, offset=entry.start).clone()
        tensor = raw.view(entry.dtype).view(entry.shape)
    else:
        tensor = _view(mm, entry)
    return tensor if entry.dtype == want else tensor.to(want)


def _derived(plan: _Plan, made: dict[int, torch.Tensor]) -> torch.Tensor:
    """A storage tie's other view: the same view of its base's new tensor as it was of the old storage."""
    assert plan.base is not None and plan.geometry is not None
    return plan.geometry.on(made[id(plan.base)])


def _assign(target: Target, new: torch.Tensor) -> Callable[[], None]:
    """Put ``new`` where the target's tensor is; returns what puts the old one back."""
    old = target.tensor
    if old.device.type != "meta":
        objects = target.objects  # a storage tie: every object gets the view, so they share it again
        previous = [tensor.data for tensor in objects]

        def restore_data() -> None:
            with torch.no_grad():
                for tensor, data in zip(objects, previous, strict=True):
                    tensor.data = data

        try:
            with torch.no_grad():
                for tensor in objects:
                    tensor.data = new
        except BaseException:
            restore_data()
            raise
        return restore_data
    replacements: dict[int, torch.Tensor] = {}  # old object -> its replacement: one object stays one object

    def replacement(value: torch.Tensor) -> torch.Tensor:
        made = replacements.get(id(value))
        if made is None:  # a Parameter stays a Parameter, a buffer on the same storage a plain tensor
            made = torch.nn.Parameter(new, requires_grad=value.requires_grad) if isinstance(
                value, torch.nn.Parameter) else new
            replacements[id(value)] = made
        return made

    held = [(slot, key, slot[key]) for slot, key in target.slots]

    def restore_slots() -> None:
        for slot, key, value in held:
            slot[key] = value
        target.tensor = old

    try:
        for slot, key, value in held:
            slot[key] = replacement(value)
    except BaseException:
        restore_slots()
        raise
    target.tensor = replacement(old)
    return restore_slots


def _assign_all(new: list[tuple[_Plan, torch.Tensor]]) -> None:
    """Assign every new tensor, or none: a failure puts back every tensor already replaced.

    Everything :func:`_resolve` can check is checked before this runs; this is what
    keeps the model unchanged if the assignment itself fails anyway.
    """
    undo: list[Callable[[], None]] = []
    for plan, tensor in new:
        try:
            undo.append(_assign(plan.target, tensor))
        except Exception as exc:
            for restore in reversed(undo):
                restore()
            header, entry = plan.source
            raise MappingError(
                f"{header.path}: tensor {entry.name!r} (model name {plan.target.names[0]!r}): "
                f"cannot be replaced by a view of the file ({type(exc).__name__}: {exc}). "
                "The model was left unchanged."
            ) from exc


def _names(plans: list[_Plan], keep: Callable[[_Plan], bool]) -> list[str]:
    return [name for plan in plans if keep(plan) for name in plan.target.names]


def map_weights(
    model: torch.nn.Module | Any,
    path: str | os.PathLike[str],
    *,
    key_map: KeyMap | None = None,
    strict: bool = False,
    allow_meta_buffers: bool | None = None,
) -> MappedWeights:
    """Point a model's weights at zero-copy views of a safetensors checkpoint.

    ``model`` is a ``torch.nn.Module`` (on the meta device, real, or mixed) or a
    ``torch.export.ExportedProgram``; ``path`` is a ``.safetensors`` file, a
    directory holding one or a ``model.safetensors.index.json``, or that index.

    Contract:

    * The file is mapped copy-on-write: it is never written, whatever the model
      does to its weights. Each tensor becomes a ``torch.frombuffer`` view: no
      read and no copy; a page becomes resident only when something reads it.
    * Meta tensors are replaced in every slot that holds them, so tied weights
      stay one object under every name; real tensors keep their object and get
      ``.data = view`` (they end up on the CPU, whatever device they were on).
      For an ExportedProgram its ``state_dict`` and ``constants`` are remapped.
    * ``key_map`` maps model names to checkpoint names: a dict (names it does
      not hold keep their own) or a callable (``None``: not in the checkpoint).
      Checkpoint names the model does not have are ignored. A tied tensor is
      satisfied by any one of its names. Several untied tensors may take one
      entry: each is then independent, as ``load_state_dict``'s copies are. The
      first is a view of the file's mapping, each further one a view of a further
      copy-on-write mapping of the same file (one per extra tensor, shared by all
      entries of that file): still no read and no copy, the same page-cache pages
      until one is written, and an in-place write to one lands in its own private
      pages, never in another. They are reported in ``mapped``.
    * A dtype mismatch is cast into new memory and a tensor whose offset is not
      a multiple of its item size is copied into aligned memory; both are
      reported in ``copied``. Persistent tensors not found are in ``missing``.
      A shape mismatch always raises, and so does a model tensor found in the
      checkpoint that cannot be replaced by a view (a tensor subclass, or a
      sparse, quantized or nested tensor).
    * Non-persistent buffers are the model's: a real one (computed by its
      ``__init__``, as under :func:`weightmap.init_empty_weights`) is left alone,
      even when the checkpoint holds that name; one on the meta device is mapped
      when the checkpoint holds it, and otherwise stays on meta (``still_meta``).
    * ``strict=True`` raises unless every tensor in the model's state_dict
      (parameters, persistent buffers, an ExportedProgram's lifted constants) is
      mapped without a copy: no name missing, as with
      ``load_state_dict(strict=True)``, and no dtype mismatch; one
      :class:`MappingError` lists every problem. Non-persistent buffers, such as
      rotary frequencies, are not required: one on meta that no checkpoint holds
      is accepted and reported in ``still_meta``. Whether the model can run (no
      tensor left on meta) is a separate check: :func:`weightmap.assert_runnable`.
    * A tied tensor is one storage, so it takes one checkpoint entry. When the
      checkpoint holds it under several of its names, those entries must hold the
      same bytes (they are read and compared): then they map to one storage and
      every name counts as mapped. Entries that differ raise a
      :class:`MappingError` naming both, whatever ``strict`` is
      (``load_state_dict`` would silently keep the last name's value).
    * Tensors that share one storage with different views (``proj_t =
      nn.Parameter(proj.weight.data.t())``, a slice, a flat view, a buffer that
      is a column of a weight) stay views of one storage, as after
      ``load_state_dict``, which copies each name into that storage. The rule:
      the tensor that is the whole storage (contiguous, from its first item; the
      first such one the checkpoint holds) is the base and is mapped from its
      entry; every other tensor of the storage becomes the same view (shape,
      strides, offset) of the base's new tensor and counts as mapped (or copied,
      with the base). Each other name the checkpoint also holds must hold exactly
      that view's values (read and compared): else a :class:`MappingError` names
      the file, both tensors and this rule, whatever ``strict`` is. A storage
      whose base the checkpoint does not hold, while it holds another of its
      tensors, and one whose tensors differ in dtype, are refused the same way.
      Views that share no item of their storage, none of them the whole
      storage (a fused weight split in slices), are independent: each maps from
      its own entry, as if it had a storage of its own. With agreeing entries
      this is what ``load_state_dict`` gives, but for that last case's storage
      identity.
    * Comparing a tie's entries reads them (through a read-only mapping, 16 MiB
      at a time), and afterwards drops from the page cache the pages the check
      brought in: the checkpoint's page-cache residency is as before the call
      (see :mod:`weightmap.pagecache` for what the kernel allows). Nothing else
      is read.
    * ``allow_meta_buffers`` is deprecated (a ``DeprecationWarning``): ``True``
      changes nothing; ``False`` refuses, before any change, a non-persistent
      buffer left on meta, as :func:`weightmap.assert_runnable` would after.
    * Each file is opened once and must be a regular file; its header is read
      from that descriptor and that descriptor is mapped, so the file mapped is
      the file validated. A file changed between the two is an error.
    * Headers are validated before anything is mapped, and every tensor is
      resolved before any is changed: an error leaves the model as it was.
    * A checkpoint larger than RAM maps (on Linux, ``MAP_NORESERVE``): only the
      pages read become resident, only the pages written become private memory.
      A mapping the kernel still refuses is a :class:`MappingError`.

    Raises :class:`MappingError` (a ``ValueError``); header problems raise
    :class:`HeaderError`. Each message names the file, the tensor and the rule.

    Example::

        with init_empty_weights():
            model = MyModel()              # parameters on meta, buffers computed
        mapped = map_weights(model, "model.safetensors", strict=True)
        print(mapped.nbytes, mapped.still_meta)   # nothing was read yet; still_meta is []
    """
    check_little_endian()
    if allow_meta_buffers is not None:
        warnings.warn(
            "map_weights(allow_meta_buffers=...) is deprecated: strict=True accepts non-persistent buffers left "
            "on meta (they are reported in still_meta); call weightmap.assert_runnable(model) to check that "
            "the model can run",
            DeprecationWarning,
            stacklevel=2,
        )
    targets = collect_targets(model)
    with open_checkpoint(path, keep_open=True) as checkpoint:
        plans = _resolve(targets, checkpoint, _key_function(key_map))
        if strict:
            problems = _strict_problems(plans)
            if problems:
                raise _strict_error(checkpoint.source, problems)
        if allow_meta_buffers is False and _meta_buffer_names(plans):
            raise MappingError(
                f"{checkpoint.source}: {meta_buffer_problem(_meta_buffer_names(plans))}. The model was left unchanged."
            )
        needed = {
            (plan.header.path, plan.mapping)
            for plan in plans
            if plan.base is None and plan.header is not None and plan.entry is not None and plan.entry.numel
        }
        maps = {(h.path, k): checkpoint.file(h).map() for h in checkpoint.headers
                for k in range(len(needed)) if (h.path, k) in needed}
    made = {id(plan): _materialise(plan, maps) for plan in plans if plan.found and plan.base is None}
    new = [(plan, made[id(plan)] if plan.base is None else _derived(plan, made)) for plan in plans if plan.found]

    _assign_all(new)

    return MappedWeights(
        mapped=_names(plans, lambda p: p.found and not p.copy_reason),
        copied=_names(plans, lambda p: p.found and bool(p.copy_reason)),
        missing=_names(plans, lambda p: not p.found and p.target.persistent),
        still_meta=_names(plans, lambda p: p.target.tensor.device.type == "meta"),
        paths=[p for p in checkpoint.files if (p, 0) in maps],
        nbytes=_view_bytes(plans),
        _maps=list(maps.values()),
    )


@dataclass(frozen=True)
class MappingPreview:
    """What :func:`map_weights` would do to a model, decided from the checkpoint's headers.

    Nothing is mapped and the model is not changed; no weight is read beyond the
    entries of a tie held twice, compared as :func:`map_weights` compares them (the
    page cache is left as it was). Names are the model's, except in ``unused``.

    Attributes:
        source: the checkpoint path as given.
        mapped: tensors that would become zero-copy views of the file.
        copied: tensor -> why it would be copied instead (a dtype cast, a misaligned offset).
        missing: persistent tensors the checkpoint does not hold.
        still_meta: tensors that would still be on the meta device afterwards.
        computed: real non-persistent buffers (the model computed them): left alone.
        unused: checkpoint tensors that no tensor of the model takes (checkpoint names).
        nbytes: bytes of the file that the views would cover, each entry once (as
            :attr:`MappedWeights.nbytes`).
        copied_bytes: bytes of new memory the copies would take, in the model's dtypes.
        strict_problems: what ``map_weights(..., strict=True)`` would refuse, one line
            each; empty when it would pass.
        dtypes: checkpoint name -> the dtype of the model tensor it would fill.
    """

    source: Path
    mapped: list[str]
    copied: dict[str, str]
    missing: list[str]
    still_meta: list[str]
    computed: list[str]
    unused: list[str]
    nbytes: int
    copied_bytes: int
    strict_problems: list[str]
    dtypes: dict[str, torch.dtype] = field(repr=False)

    def __repr__(self) -> str:
        return (
            f"MappingPreview(mapped={len(self.mapped)}, copied={len(self.copied)}, missing={len(self.missing)}, "
            f"still_meta={len(self.still_meta)}, computed={len(self.computed)}, unused={len(self.unused)}, "
            f"nbytes={self.nbytes}, copied_bytes={self.copied_bytes}, "
            f"strict={'fails' if self.strict_problems else 'passes'})"
        )


def preview_from(
    model: torch.nn.Module | Any, checkpoint: Checkpoint, *, key_map: KeyMap | None = None
) -> MappingPreview:
    """:func:`preview_mapping` for a checkpoint already opened (its headers validated)."""
    plans = _resolve(collect_targets(model), checkpoint, _key_function(key_map))
    used = {name for plan in plans for name in plan.entry_names}
    copied_bytes = 0
    for plan in plans:
        if plan.base is None and plan.entry is not None and plan.copy_reason:
            copied_bytes += plan.entry.numel * plan.target.tensor.dtype.itemsize
    return MappingPreview(
        source=checkpoint.source,
        mapped=_names(plans, lambda p: p.found and not p.copy_reason),
        copied={name: plan.copy_reason for plan in plans if plan.copy_reason for name in plan.target.names},
        missing=_names(plans, lambda p: not p.found and p.target.persistent),
        still_meta=_names(plans, lambda p: not p.found and p.target.tensor.device.type == "meta"),
        computed=_names(plans, lambda p: p.computed),
        unused=[name for name in checkpoint.entries if name not in used],
        nbytes=_view_bytes(plans),
        copied_bytes=copied_bytes,
        strict_problems=_strict_problems(plans),
        dtypes={plan.entry.name: plan.target.tensor.dtype for plan in plans if plan.entry is not None},
    )


def preview_mapping(
    model: torch.nn.Module | Any, path: str | os.PathLike[str], *, key_map: KeyMap | None = None
) -> MappingPreview:
    """What :func:`map_weights` would map, copy, miss and leave on meta, without mapping anything.

    Reads and validates the checkpoint's headers (``path`` as for
    :func:`map_weights`) and decides every tensor as :func:`map_weights` would;
    nothing is mapped for the model and the model is left as it is. No weight is
    read, except where the checkpoint holds a tie under several names: those
    entries are compared as :func:`map_weights` compares them (read 16 MiB at a
    time through a read-only mapping), and the pages that brought into the page
    cache are dropped again, so the checkpoint's page-cache residency is as
    before the call. What would
    make :func:`map_weights` raise whatever ``strict`` is (a shape mismatch, a
    tensor that cannot be replaced, a bad header) raises the same
    :class:`MappingError` here.

    Example::

        with init_empty_weights():
            model = MyModel()
        preview = preview_mapping(model, "model.safetensors")
        print(preview.copied, preview.strict_problems)
    """
    check_little_endian()
    with open_checkpoint(path, keep_open=True) as checkpoint:
        return preview_from(model, checkpoint, key_map=key_map)
