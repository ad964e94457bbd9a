"""The built model against eager: does the compiled pipeline compute what the model computes?

:func:`compare_outputs` compares every output element by element, at the tolerance of the
output's dtype (:data:`TOLERANCES`). That rule is right where the model computes in the
output's precision. A model whose layers run in bfloat16 and whose output is float32
(lerobot's pi0.5: bfloat16 transformers, a float32 action head) differs from any other
correct evaluation of itself by bfloat16 rounding, far beyond float32's tolerance: a
compiler that fuses and reorders sums lands elsewhere inside that noise, not wrong.

For such a model the judge is a more precise run of eager (:func:`upcast_reference`: the
same module with its bfloat16/float16 tensors made float32, on the same inputs). An output
that fails element by element still passes when the built model's RMS error against that
run is at most :data:`REFERENCE_MULTIPLIER` times eager's own: the compiled model is then
as accurate as the model it was compiled from. Both errors are stated in the detail.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from harness.units import format_gib
from weightmap import release_mapped_storage

__all__ = [
    "REFERENCE_MULTIPLIER",
    "TOLERANCES",
    "Checked",
    "OutputMatch",
    "MismatchError",
    "compare_outputs",
    "compare_with_eager",
    "upcast_reference",
]

TOLERANCES: Mapping[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
"""(atol, rtol) per output dtype: an element passes when ``|built - eager| <= atol + rtol * |eager|``.

Looser than bit equality because a compiler fuses and reorders floating-point sums."""

REFERENCE_MULTIPLIER = 3.0
"""How much larger than eager's own error (against a float32 run) the built model's may be."""

_LOW_PRECISION = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Checked:
    """A check's outcome: the ``comparison`` of the built model with eager, and ``peak_bytes``, the host
    high-water mark of the processes it ran in (None where it ran in the measuring process)."""

    comparison: OutputMatch
    peak_bytes: int | None = None


class MismatchError(AssertionError):
    """The built model's output differs from the eager model's beyond the dtype's tolerance."""


@dataclass(frozen=True)
class OutputMatch:
    """The built model against eager on one input: the largest absolute difference over outputs."""

    max_abs_diff: float
    outputs: int
    ok: bool
    detail: str

    def check(self) -> OutputMatch:
        """Raise :class:`MismatchError` unless every output is within tolerance; returns self."""
        if not self.ok:
            raise MismatchError(self.detail)
        return self


def compare_with_eager(
    built: Callable[..., Any],
    eager: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
) -> OutputMatch:
    """Run both on the same inputs and compare every output (see :data:`TOLERANCES`).

    Outputs must match in structure, shape and dtype; integer and bool outputs must be
    equal. Differences are computed in float64 on the CPU. Call ``.check()`` on the result
    to make a mismatch an error.

    Example::

        compare_with_eager(pipeline, model, (tokens,)).check()
    """
    kw = dict(kwargs or {})
    with torch.no_grad():
        got = built(*args, **kw)
        want = eager(*args, **kw)
    return compare_outputs(got, want)


def _rms(t: torch.Tensor) -> float:
    return float(t.pow(2).mean().sqrt()) if t.numel() else 0.0


def compare_outputs(built: Any, eager: Any, reference: Any = None) -> OutputMatch:
    """Compare outputs already computed (any pytree of tensors), as :func:`compare_with_eager` does.

    ``reference``: the outputs of a more precise run of eager (:func:`upcast_reference`), or
    None. With it, an output outside its dtype's tolerance passes when the built model's RMS
    error against the reference is at most :data:`REFERENCE_MULTIPLIER` times eager's own
    (plus the dtype's atol); the detail gives both errors either way.

    Example::

        compare_outputs(pipeline(x), model(x)).check()
    """
    got = pytree.tree_leaves(built)
    want = pytree.tree_leaves(eager)
    ref = pytree.tree_leaves(reference) if reference is not None else None
    if len(got) != len(want):
        detail = f"the built model returns {len(got)} values, eager {len(want)}"
        return OutputMatch(float("inf"), len(want), False, detail)
    worst = 0.0
    problems: list[str] = []
    accepted: list[str] = []
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if not isinstance(w, torch.Tensor) or not isinstance(g, torch.Tensor):
            if g != w:
                problems.append(f"output {i}: {g!r} != {w!r}")
            continue
        if g.shape != w.shape or g.dtype != w.dtype:
            problems.append(f"output {i}: {g.dtype}{list(g.shape)} built, {w.dtype}{list(w.shape)} eager")
            continue
        a, b = g.detach().cpu().double(), w.detach().cpu().double()
        diff = (a - b).abs()
        largest = float(diff.max()) if diff.numel() else 0.0
        worst = max(worst, largest)
        atol, rtol = TOLERANCES.get(w.dtype, (0.0, 0.0))
        bad = int((diff > atol + rtol * b.abs()).sum())
        if not bad:
            continue
        what = (f"output {i}: {bad} of {diff.numel()} elements differ beyond {atol:g} + {rtol:g}*|eager| "
                f"for {w.dtype} (largest difference {largest:.3g}, eager's RMS {_rms(b):.3g})")
        r = ref[i] if ref is not None and i < len(ref) else None
        if not isinstance(r, torch.Tensor) or r.shape != w.shape or not w.dtype.is_floating_point:
            problems.append(what)
            continue
        rr = r.detach().cpu().double()
        built_err, eager_err = _rms(a - rr), _rms(b - rr)
        ratio = built_err / eager_err if eager_err else float("inf")
        errors = (f"RMS error against a {r.dtype} run of eager: built {built_err:.3g}, eager {eager_err:.3g} "
                  f"({ratio:.2f}x eager's")
        if built_err <= REFERENCE_MULTIPLIER * eager_err + atol:
            accepted.append(f"{what}, as eager differs from a more precise run of itself: {errors}, "
                            f"within {REFERENCE_MULTIPLIER:g}x)")
        else:
            problems.append(f"{what}; {errors}, beyond {REFERENCE_MULTIPLIER:g}x)")
    if problems:
        detail = "; ".join(problems)
    else:
        detail = f"every output within tolerance (max abs diff {worst:.3g})"
        if accepted:
            detail = f"every output as accurate as eager (max abs diff {worst:.3g}): " + "; ".join(accepted)
    return OutputMatch(worst, len(want), not problems, detail)


def upcast_reference(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    free_bytes: int,
) -> tuple[Any, str]:
    """Eager's outputs with ``module``'s bfloat16/float16 tensors made float32; ``(outputs, "")``.

    ``module`` is changed in place (call it after its own outputs are taken); the pages of
    tensors it maps (:func:`weightmap.map_weights`) are dropped as their copies are made, so
    ``free_bytes`` need only hold the copies. Where it holds
    no such tensor, or the float32 copies would not fit in ``free_bytes`` (with a fifth to
    spare), nothing is run and the outputs are None, with the reason.

    Example::

        want = model(x)
        reference, why = upcast_reference(model, (x,), {}, free_bytes=available)
        compare_outputs(pipeline(x), want, reference)
    """
    tensors = [t for t in (*module.parameters(), *module.buffers()) if t.dtype in _LOW_PRECISION]
    if not tensors:
        return None, "the model computes in its outputs' precision already: no more precise run of eager exists"
    need = sum(t.numel() for t in tensors) * 4
    if need * 1.2 > free_bytes:
        return None, (f"no float32 run of eager to compare with: its copies need {format_gib(need)}, "
                      f"{format_gib(free_bytes)} free")
    for sub in module.modules():
        for p in sub._parameters.values():
            if p is not None and p.dtype in _LOW_PRECISION:
                old = p.data
                p.data = old.float()
                release_mapped_storage(old)  # a mapped original's pages leave RSS as its copy comes in
        for key, b in sub._buffers.items():
            if b is not None and b.dtype in _LOW_PRECISION:
                sub._buffers[key] = b.float()
                release_mapped_storage(b)
    with torch.no_grad():
        return module(*args, **kwargs), ""
