"""Every file the harness writes goes through its one atomic writer (:mod:`harness.fileio.atomic`).

Each writer's file is checked for what that writer guarantees: written under a temporary name beside it,
flushed to disk (fsync) before the rename, and the directory flushed after; a failure mid-write leaves the
earlier file as it was and no temporary file behind.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.errors import OutputError
from harness.fileio.atomic import atomic_file, write_atomic
from harness.units import KIB

Fsynced = list[Path]


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> Fsynced:
    """The paths of the files and directories this process fsyncs, in order."""
    seen: Fsynced = []
    real = os.fsync

    def spy(fd: Any) -> None:
        number = fd if isinstance(fd, int) else fd.fileno()
        seen.append(Path(os.readlink(f"/proc/self/fd/{number}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen


def assert_atomic(path: Path, fsynced: Fsynced) -> None:
    """``path`` was written as the atomic writer writes: a temporary beside it fsynced, then its directory."""
    temporaries = [p for p in fsynced if p.parent == path.parent and p.name.startswith(f".{path.name}.")]
    assert temporaries, f"{path.name} was not written to a temporary file flushed to disk: {fsynced}"
    assert path.parent in fsynced[fsynced.index(temporaries[-1]):], f"{path.parent} not flushed after the rename"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")], "a temporary is left"


def failing_mid_write(obj: object, f: Any, *args: object, **kwargs: object) -> None:
    """``torch.save`` that writes part of the file, then fails as a full disk does."""
    f.write(b"part of a file")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_failure_mid_write_leaves_the_earlier_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    path.write_bytes(b"earlier")
    full = r"out\.bin: cannot write \(No space left on device\); any earlier file"
    with pytest.raises(OutputError, match=full), atomic_file(path) as handle:
        handle.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert path.read_bytes() == b"earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_write_atomic_is_the_atomic_writer(tmp_path: Path, fsynced: Fsynced) -> None:
    write_atomic(tmp_path / "a.json", "{}")
    assert_atomic(tmp_path / "a.json", fsynced)


@pytest.fixture
def checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from safetensors.torch import save_file

    monkeypatch.chdir(tmp_path)  # a user's checkpoint: its conversion goes under the test's own data directory
    path = tmp_path / "tiny.safetensors"
    save_file({"a": torch.ones(4, 4), "b": torch.zeros(8)}, str(path))
    return path


def test_the_torch_mmap_conversion_and_its_record_are_written_atomically(checkpoint: Path, fsynced: Fsynced) -> None:
    from harness.load.peers import converted_path, ensure_pt

    pt = converted_path(checkpoint)
    assert ensure_pt(checkpoint, pt)
    assert_atomic(pt, fsynced)
    assert_atomic(pt.with_name(pt.name + ".source.json"), fsynced)


def test_a_conversion_that_fails_mid_write_leaves_the_earlier_one(checkpoint: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.load.peers import converted_path, ensure_pt

    pt = converted_path(checkpoint)
    ensure_pt(checkpoint, pt)
    sidecar = pt.with_name(pt.name + ".source.json")
    before = {pt: pt.read_bytes(), sidecar: sidecar.read_bytes()}
    stat = checkpoint.stat()
    os.utime(checkpoint, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # to be converted again
    monkeypatch.setattr(torch, "save", failing_mid_write)
    with pytest.raises(OutputError, match=rf"{pt.name}: cannot write \(No space left on device\)"):
        ensure_pt(checkpoint, pt)
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in pt.parent.iterdir()) == sorted([pt.name, sidecar.name]), "no temporary file left"
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == sorted([checkpoint.name, "data"]), \
        "nothing beside a user's checkpoint"


def test_the_check_processes_files_are_written_atomically(tmp_path: Path, fsynced: Fsynced,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.engines.compile import check_process

    written: list[Path] = []

    def stage(stage: str, request: Path, outputs: Path, result: Path) -> dict[str, Any]:
        written.append(request)
        assert_atomic(request, fsynced)  # before it is removed
        return {"peak_bytes": 1, "max_abs_diff": 0.0, "outputs": 1, "ok": True, "detail": ""}

    monkeypatch.setattr(check_process, "_run_stage", stage)
    check_process.check_in_processes({"a request": 1}, tmp_path)  # type: ignore[arg-type]
    assert written
    # a stage's process: its result (here an error, as there is no request to read)
    result = tmp_path / "result.json"
    assert check_process.main(["eager", str(tmp_path / "absent.pt"), str(tmp_path / "o.pt"), str(result)]) == 1
    assert "error" in json.loads(result.read_text())
    assert_atomic(result, fsynced)


def test_the_benchmarks_torch_save_checkpoint_is_written_atomically(tmp_path: Path, fsynced: Fsynced) -> None:
    from harness.bench_map import make_checkpoints

    _, pt, _ = make_checkpoints(tmp_path, 2, 64 * KIB)
    assert_atomic(pt, fsynced)


def test_a_repeats_files_copied_to_the_top_are_written_atomically(tmp_path: Path, fsynced: Fsynced) -> None:
    from harness.results.record import strategy_file
    from harness.results.repeats import copy_run_files

    source, target = tmp_path / "repeat-1", tmp_path / "top"
    source.mkdir()
    target.mkdir()
    (source / strategy_file("map")).write_text("{}")
    copy_run_files(source, target, "map")
    assert (target / strategy_file("map")).read_text() == "{}"
    assert_atomic(target / strategy_file("map"), fsynced)
