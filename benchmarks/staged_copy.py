"""Is the copy builder's staged copy to a CUDA device bit-exact, and how fast is it?

Writes a small safetensors checkpoint of tensors chosen to hit the edges (bf16 and fp32, sizes
that are no multiple of a page or of the 16 MiB staging buffer, one tensor larger than the whole
ring, an empty one), maps it with :func:`weightmap.map_weights`, and builds each "engine" with
:class:`harness.engines.copy.CopyToDevice` through its pinned ring
(:class:`harness.engines.pinned.PinnedRing`), a non-contiguous view added to one engine (copied
as it is, not staged). Every device copy is compared byte for byte with a plain ``.to("cuda")`` of
the same tensor. Then it times, over ``--mib`` MiB in ``--engines`` engines (pages resident, so
that the copy alone is timed): plain pageable ``.to`` copies, one tensor at a time, against the
staged build's wall time (pages touched, copies on the copier's thread, last engine waited for).

    python benchmarks/staged_copy.py                    # checks, then 2 GiB in 8 engines
    python benchmarks/staged_copy.py --mib 4096 --engines 16

It needs a CUDA device; it exits with status 1 where a copy differs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from harness.engines.copy import CopyToDevice, fault_in
from harness.engines.staging import CHUNK_BYTES, SLOTS
from weightmap import map_weights, save_weights_for_mapping


class Weights(torch.nn.Module):
    """A module holding the given tensors as parameters ``p0``, ``p1``, ..."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        for i, t in enumerate(tensors):
            self.register_parameter(f"p{i}", torch.nn.Parameter(t, requires_grad=False))


def mapped(tensors: list[torch.Tensor], folder: Path) -> dict[str, torch.Tensor]:
    """``tensors`` written to a checkpoint in ``folder`` and mapped back, by name."""
    path = save_weights_for_mapping(Weights(tensors), folder / "w.safetensors")
    with torch.device("meta"):
        model = Weights([torch.empty(t.shape, dtype=t.dtype) for t in tensors])
    map_weights(model, path)
    return dict(model.named_parameters())


def check(folder: Path) -> bool:
    """Every staged copy equal, byte for byte, to a plain ``.to("cuda")``."""
    g = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(4099, 7, generator=g).to(torch.bfloat16),    # odd size, bf16
        torch.randn(1, generator=g),                              # one fp32 element
        torch.randn(3, 5, 17, generator=g),                       # odd size, fp32
        torch.randn(CHUNK_BYTES * SLOTS // 4 + 3, generator=g),   # more than the whole ring, odd tail
        torch.empty(0),                                           # nothing to copy
        torch.randn(513, 1023, generator=g).to(torch.bfloat16),
    ]
    named = mapped(tensors, folder)
    engines = [{k: named[k] for k in ("p0", "p1", "p2")}, {k: named[k] for k in ("p3", "p4", "p5")}]
    engines[1]["p5.t"] = named["p5"].t()  # non-contiguous: copied as it is, on the building thread
    builder = CopyToDevice(device="cuda")
    done: list[int] = []
    for k, tensors_of in enumerate(engines):
        builder.build(k, tensors_of, done.append)
    builder.finish(done.append)
    ok = done == [0, 1]
    for tensors_of, copies in zip(engines, builder.engines, strict=True):
        for name, t in tensors_of.items():
            plain = t.to("cuda")
            same = (copies[name].dtype == plain.dtype and copies[name].shape == plain.shape
                    and torch.equal(copies[name].contiguous().view(torch.uint8), plain.contiguous().view(torch.uint8)))
            print(f"{'ok  ' if same else 'DIFF'} {name}: {t.dtype} {tuple(t.shape)}"
                  f"{'' if t.is_contiguous() else ' (non-contiguous, not staged)'}")
            ok &= same
    builder.close()
    return ok


def timed(mib: int, engines: int, folder: Path) -> None:
    """Plain pageable copies against the staged build, the pages resident for both."""
    per = mib * 2**20 // engines // 2  # bf16 elements per engine
    named = mapped([torch.ones(per, dtype=torch.bfloat16) for _ in range(engines)], folder)
    parts = [{f"p{k}": named[f"p{k}"]} for k in range(engines)]
    fault_in(named.values())
    torch.cuda.synchronize()
    start = time.perf_counter()
    kept = [{n: t.to("cuda") for n, t in part.items()} for part in parts]
    torch.cuda.synchronize()
    plain_s = time.perf_counter() - start
    del kept
    builder = CopyToDevice(device="cuda")
    builder.build(0, {"warm": torch.ones(1)}, lambda i: None)  # the ring and the copier's thread made
    builder.finish(lambda i: None)
    start = time.perf_counter()
    for k, part in enumerate(parts):
        builder.build(k + 1, part, lambda i: None)
    builder.finish(lambda i: None)
    staged_s = time.perf_counter() - start
    builder.close()
    gib = mib / 1024
    print(f"{mib} MiB in {engines} engines, pages resident: plain .to('cuda') {plain_s:.3f} s "
          f"({gib / plain_s:.2f} GiB/s); staged through {SLOTS} x {CHUNK_BYTES >> 20} MiB pinned "
          f"{staged_s:.3f} s ({gib / staged_s:.2f} GiB/s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=2048, help="MiB copied in the timing")
    parser.add_argument("--engines", type=int, default=8, help="engines the timing's MiB are cut into")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("staged_copy: needs a CUDA device", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "check").mkdir()
        ok = check(Path(folder) / "check")
        timed(args.mib, args.engines, Path(folder))
    print("bit-exact" if ok else "a staged copy differs from .to('cuda')")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
