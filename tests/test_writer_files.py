"""How checkpoints are put on disk: permissions, symlinks, no temporary file left, clear errors.

Covers write_checkpoint and save_weights_for_mapping, which both write through
weightmap.atomic_write.AtomicFile.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import TinyNet, seeded, tmpfs

from weightmap import atomic_write, save_weights_for_mapping
from weightmap.atomic_write import SUFFIX, AtomicFile
from weightmap.streamwrite import TensorSpec, write_checkpoint

ROOT = Path(__file__).resolve().parent.parent
SPECS = [TensorSpec("w", torch.float32, (256,)), TensorSpec("b", torch.float32, (4,))]


def save(path: Path, value: float = 1.0) -> None:
    write_checkpoint(path, SPECS, lambda spec: torch.full(spec.shape, value))


def value_of(path: Path) -> float:
    return float(load_file(str(path))["w"][0])


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def hidden(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


def unnamed_files_here(directory: Path) -> bool:
    """Whether this directory's file system gives AtomicFile unnamed (O_TMPFILE) files."""
    fd = AtomicFile._open_unnamed(directory)
    if fd is None:
        return False
    os.close(fd)
    return True


# --------------------------------------------------------------------------- permissions


@pytest.mark.parametrize("bits", [0o600, 0o640, 0o444, 0o755])
def test_replacing_a_file_keeps_its_permission_bits(bits: int, tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save(path, 1.0)
    os.chmod(path, bits)
    save(path, 2.0)
    assert value_of(path) == 2.0
    assert mode(path) == bits


def test_a_new_file_gets_the_umask_default(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        save(tmp_path / "new.safetensors")
    finally:
        os.umask(old)
    assert mode(tmp_path / "new.safetensors") == 0o640


def test_save_weights_for_mapping_keeps_a_private_checkpoint_private(tmp_path: Path) -> None:
    path = tmp_path / "private.safetensors"
    model = seeded(TinyNet())
    save_weights_for_mapping(model, path)
    os.chmod(path, 0o600)
    save_weights_for_mapping(model, path)
    assert mode(path) == 0o600


# --------------------------------------------------------------------------- symlinks


def test_writing_onto_a_symlink_replaces_the_file_it_points_to(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    real = tmp_path / "store" / "real.safetensors"
    save(real, 1.0)
    os.chmod(real, 0o600)
    link = tmp_path / "link.safetensors"
    link.symlink_to(Path("store") / "real.safetensors")
    chained = tmp_path / "chained.safetensors"
    chained.symlink_to("link.safetensors")
    save(chained, 2.0)
    assert os.readlink(chained) == "link.safetensors" and os.readlink(link) == "store/real.safetensors"
    assert value_of(real) == 2.0 and mode(real) == 0o600
    assert hidden(tmp_path) == [] and hidden(tmp_path / "store") == []


def test_save_weights_for_mapping_follows_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real.safetensors"
    link = tmp_path / "link.safetensors"
    model = seeded(TinyNet())
    save_weights_for_mapping(model, real)
    link.symlink_to(real.name)
    assert save_weights_for_mapping(model, link) == link
    assert link.is_symlink() and os.readlink(link) == real.name
    assert torch.equal(load_file(str(link))["embed.weight"], model.embed.weight)


def test_a_dangling_symlink_gets_its_target_created(tmp_path: Path) -> None:
    link = tmp_path / "link.safetensors"
    link.symlink_to("made.safetensors")
    save(link)
    assert link.is_symlink() and (tmp_path / "made.safetensors").is_file()


@pytest.mark.parametrize("deferred", [False, True])
def test_without_following_symlinks_the_link_itself_is_replaced(tmp_path: Path, deferred: bool) -> None:
    (tmp_path / "blobs").mkdir()
    blob = tmp_path / "blobs" / "sha"
    blob.write_bytes(b"shared")
    os.chmod(blob, 0o640)
    link = tmp_path / "model.safetensors"
    link.symlink_to(Path("blobs") / "sha")
    out = AtomicFile(link, deferred=deferred, follow_symlinks=False)
    with out:
        out.write(b"new")
    if deferred:
        assert link.is_symlink()  # nothing visible before publish
        out.publish()
    assert not link.is_symlink() and link.read_bytes() == b"new" and mode(link) == 0o640
    assert blob.read_bytes() == b"shared" and out.identity == (link.stat().st_dev, link.stat().st_ino)
    assert hidden(tmp_path) == []


def test_a_symlink_loop_is_an_error_naming_the_path(tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.symlink_to(b.name)
    b.symlink_to(a.name)
    with pytest.raises(OSError, match="symlink loop") as info:
        save(a)
    assert info.value.errno == errno.ELOOP and info.value.filename == str(a)
    assert sorted(os.listdir(tmp_path)) == ["a.safetensors", "b.safetensors"]


def test_a_fifo_is_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file") as info:
        save(fifo)
    assert info.value.filename == str(fifo) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.listdir(tmp_path) == ["pipe.safetensors"]


# --------------------------------------------------------------------------- errors


def assert_names_target(error: OSError, target: Path, code: int) -> None:
    assert error.errno == code
    assert error.filename == str(target)
    assert SUFFIX not in str(error) and "#" not in str(error)
    assert "unchanged" in str(error)


def test_a_missing_directory_is_an_error_naming_the_target(tmp_path: Path) -> None:
    target = tmp_path / "absent" / "m.safetensors"
    with pytest.raises(FileNotFoundError) as info:
        save(target)
    assert_names_target(info.value, target, errno.ENOENT)
    assert "absent" in str(info.value)


def test_no_space_is_an_error_naming_the_target_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "m.safetensors"
    save(target, 1.0)
    real_write = os.write

    def full_disk(fd: int, data: bytes) -> int:  # the disk fills once the header is written
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)) and len(data) > 512:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError) as info:
        save(target, 2.0)
    monkeypatch.undo()
    assert_names_target(info.value, target, errno.ENOSPC)
    assert os.listdir(tmp_path) == ["m.safetensors"] and value_of(target) == 1.0


def test_a_full_file_system_is_an_error_naming_the_target(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "size=256k") as small:
        target = small / "m.safetensors"
        save(target, 1.0)
        big = [TensorSpec("w", torch.float32, (1024, 1024))]
        with pytest.raises(OSError) as info:
            write_checkpoint(target, big, lambda spec: torch.ones(spec.shape))
        assert_names_target(info.value, target, errno.ENOSPC)
        assert os.listdir(small) == ["m.safetensors"] and value_of(target) == 1.0


def test_a_read_only_directory_is_an_error_naming_the_target(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "size=1m") as directory:
        target = directory / "m.safetensors"
        save(target, 1.0)
        remount = subprocess.run(["mount", "-o", "remount,ro", str(directory)], capture_output=True, text=True)
        if remount.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remount.stderr.strip()}")
        with pytest.raises(OSError) as info:
            save(target, 2.0)
        assert_names_target(info.value, target, errno.EROFS)
        assert value_of(target) == 1.0


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes to read-only directories")
def test_a_directory_without_write_permission_is_an_error_naming_the_target(tmp_path: Path) -> None:
    directory = tmp_path / "locked"
    directory.mkdir()
    os.chmod(directory, 0o555)
    try:
        with pytest.raises(PermissionError) as info:
            save(directory / "m.safetensors")
    finally:
        os.chmod(directory, 0o755)
    assert_names_target(info.value, directory / "m.safetensors", errno.EACCES)


# --------------------------------------------------------------------------- no temporary left


def test_without_o_tmpfile_an_exception_leaves_no_hidden_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AtomicFile, "_open_unnamed", staticmethod(lambda directory: None))
    target = tmp_path / "m.safetensors"
    save(target, 1.0)

    def fill(spec: TensorSpec) -> torch.Tensor:
        assert len(hidden(tmp_path)) == 1, "the named fallback writes under a hidden name"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_checkpoint(target, SPECS, fill)
    assert os.listdir(tmp_path) == ["m.safetensors"] and value_of(target) == 1.0


def test_without_o_tmpfile_a_save_survives_another_removing_its_file_before_it_is_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two saves in one directory: the second one's clean-up runs in the window between the
    # first one creating its hidden file and locking it, sees a free lock, and removes it.
    monkeypatch.setattr(AtomicFile, "_open_unnamed", staticmethod(lambda directory: None))
    real_lock = atomic_write.try_lock
    raced: list[int] = []

    def lock_after_another_save_cleaned_up(fd: int) -> bool | None:
        if not raced:
            raced.append(fd)
            directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                atomic_write._remove_abandoned(directory)
            finally:
                os.close(directory)
        return real_lock(fd)

    monkeypatch.setattr(atomic_write, "try_lock", lock_after_another_save_cleaned_up)
    target = tmp_path / "m.safetensors"
    save(target, 2.0)  # raised FileNotFoundError for the hidden file before
    assert raced and value_of(target) == 2.0 and os.listdir(tmp_path) == ["m.safetensors"]


def test_a_refused_link_falls_back_to_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not unnamed_files_here(tmp_path):
        pytest.skip("this file system has no O_TMPFILE")

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refuse)
    target = tmp_path / "m.safetensors"
    save(target, 3.0)
    assert value_of(target) == 3.0 and os.listdir(tmp_path) == ["m.safetensors"]


KILLED_WRITE = r"""
import sys, time, torch
from weightmap.streamwrite import TensorSpec, write_checkpoint

def fill(spec):
    if spec.name == "b":  # "w" is written by now
        print("writing", flush=True)
        time.sleep(120)
    return torch.full(spec.shape, 2.0)

write_checkpoint(sys.argv[1], [TensorSpec("w", torch.float32, (1 << 20,)), TensorSpec("b", torch.float32, (4,))], fill)
"""


def start_child(script: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )


def wait_for(child: subprocess.Popen[str], line: str) -> None:
    assert child.stdout is not None
    got = child.stdout.readline().strip()
    if got != line:
        child.kill()
        _, err = child.communicate(timeout=60)
        raise AssertionError(f"the child wrote {got!r}, not {line!r}: {err[-2000:]}")


def test_sigkill_mid_write_leaves_the_old_file_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "m.safetensors"
    save(target, 1.0)
    child = start_child(KILLED_WRITE, str(target))
    try:
        wait_for(child, "writing")
        before = hidden(tmp_path)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert value_of(target) == 1.0
    if unnamed_files_here(tmp_path):
        assert before == [] and os.listdir(tmp_path) == ["m.safetensors"], "an unnamed file leaves nothing"
    else:  # the hidden file the killed writer left goes with the next save in the directory
        assert len(before) == 1
        save(tmp_path / "other.safetensors")
        assert sorted(os.listdir(tmp_path)) == ["m.safetensors", "other.safetensors"]


# The named fallback in a child that needs no torch (so it starts at once): atomic_write is
# loaded from its file, which imports nothing but the standard library.
NAMED_WRITER = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("atomic_write", sys.argv[1])
atomic_write = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic_write)
atomic_write.AtomicFile._open_unnamed = staticmethod(lambda directory: None)
with atomic_write.AtomicFile(sys.argv[2]) as out:
    out.write(b"x" * 4096)
    print("writing", flush=True)
    sys.stdin.readline()
    out.write(b"y" * 4096)
print("done", flush=True)
"""


def test_a_writer_killed_without_o_tmpfile_leaves_a_file_the_next_save_removes(tmp_path: Path) -> None:
    source = str(ROOT / "weightmap" / "atomic_write.py")
    killed = start_child(NAMED_WRITER, source, str(tmp_path / "killed.bin"))
    running = start_child(NAMED_WRITER, source, str(tmp_path / "running.bin"))
    try:
        wait_for(killed, "writing")
        wait_for(running, "writing")
        killed.send_signal(signal.SIGKILL)
        killed.communicate(timeout=60)
        left = hidden(tmp_path)
        assert len(left) == 2 and all(name.endswith(SUFFIX) for name in left)
        save(tmp_path / "m.safetensors")  # removes the killed writer's file, not the running one's
        after = hidden(tmp_path)
        assert len(after) == 1 and after[0].startswith(".running.bin.")
        out, err = running.communicate("go\n", timeout=60)
        assert out.strip() == "done", err[-2000:]
    finally:
        for child in (killed, running):
            if child.poll() is None:
                child.kill()
                child.communicate(timeout=60)
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors", "running.bin"]
    assert (tmp_path / "running.bin").read_bytes() == b"x" * 4096 + b"y" * 4096
