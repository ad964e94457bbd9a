"""convert touches only the checkpoint it replaces: never a file a symlink points to, never a file that is
not a checkpoint by name, never a name it did not create; a later conversion finishes an interrupted one."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_convert_commit import SHARD, listing, read, same, sharded, tensors

from weightmap import MappingError, convert_checkpoint
from weightmap.atomic_write import AtomicFile
from weightmap.checkpoint import INDEX_NAME
from weightmap.cli import main
from weightmap.commit import _Transaction

ROOT = Path(__file__).resolve().parent.parent
SINGLE = "model.safetensors"


def as_hub_cache(folder: Path, root: Path) -> Path:
    """The Hugging Face cache layout: each file of ``folder`` moved to ``root/blobs/<name>`` and linked to
    from ``root/snapshots/rev/<name>``; returns the snapshot folder."""
    blobs, snapshot = root / "blobs", root / "snapshots" / "rev"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in sorted(folder.iterdir()):
        blob = blobs / f"sha-{path.name}"
        path.rename(blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    folder.rmdir()
    return snapshot


def contents(folder: Path) -> dict[str, bytes | str]:
    """Each name of ``folder``: a link's text, or a file's bytes."""
    return {p.name: os.readlink(p) if p.is_symlink() else p.read_bytes() for p in sorted(folder.iterdir())}


def lone(folder: Path, values: dict[str, torch.Tensor]) -> Path:
    folder.mkdir()
    save_file(values, str(folder / SINGLE))
    return folder


# --------------------------------------------------------------------------- symbolic links


@pytest.mark.parametrize("layout", ["shards", "lone"])
def test_a_symlinked_checkpoint_converted_in_place_becomes_real_files_and_the_blobs_stay(
    tmp_path: Path, layout: str
) -> None:
    original = tensors()
    folder = sharded(tmp_path / "ckpt", original) if layout == "shards" else lone(tmp_path / "ckpt", original)
    snapshot = as_hub_cache(folder, tmp_path / "hub")
    blobs = contents(tmp_path / "hub" / "blobs")
    convert_checkpoint(snapshot, snapshot, dtype=torch.float32, max_shard_size=SHARD // 2)  # same names
    assert contents(tmp_path / "hub" / "blobs") == blobs  # no byte of a shared blob rewritten
    assert not any(p.is_symlink() for p in snapshot.iterdir())
    assert same(read(snapshot), {k: v.float() for k, v in original.items()})
    assert listing(snapshot) == {INDEX_NAME, *(f"model-0000{i}-of-00004.safetensors" for i in range(1, 5))}


def test_a_lone_symlinked_file_replaced_by_a_lone_file_is_a_real_file(tmp_path: Path) -> None:
    original = tensors()
    snapshot = as_hub_cache(lone(tmp_path / "ckpt", original), tmp_path / "hub")
    blobs = contents(tmp_path / "hub" / "blobs")
    convert_checkpoint(snapshot, snapshot, dtype=torch.float32, max_shard_size=10**9)
    assert contents(tmp_path / "hub" / "blobs") == blobs
    assert listing(snapshot) == {SINGLE} and not (snapshot / SINGLE).is_symlink()
    assert same(read(snapshot), {k: v.float() for k, v in original.items()})


def test_a_symlinked_file_destination_is_replaced_not_written_through(tmp_path: Path) -> None:
    original = tensors()
    snapshot = as_hub_cache(lone(tmp_path / "ckpt", original), tmp_path / "hub")
    blobs = contents(tmp_path / "hub" / "blobs")
    convert_checkpoint(snapshot / SINGLE, snapshot / SINGLE, dtype=torch.float32)
    assert contents(tmp_path / "hub" / "blobs") == blobs
    assert not (snapshot / SINGLE).is_symlink()
    assert same(read(snapshot), {k: v.float() for k, v in original.items()})


def test_a_failed_commit_puts_the_links_back_as_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = as_hub_cache(sharded(tmp_path / "ckpt", tensors()), tmp_path / "hub")
    before = contents(snapshot)
    blobs = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "hub" / "blobs").iterdir()}

    def fail(self: _Transaction, *args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(_Transaction, "commit", fail)
    with pytest.raises(OSError, match="Input/output"):
        convert_checkpoint(snapshot, snapshot, dtype=torch.float32, max_shard_size=SHARD // 2)
    assert contents(snapshot) == before  # the index and the shards: the same links
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (tmp_path / "hub" / "blobs").iterdir()} == blobs


# --------------------------------------------------------------------------- the roll-back removes only its own names


@pytest.mark.parametrize("failure", [OSError(errno.EIO, "Input/output error"), KeyboardInterrupt()])
def test_a_failed_rename_of_a_new_lone_file_leaves_the_earlier_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException
) -> None:
    folder = lone(tmp_path / "ckpt", tensors(0))
    before = contents(folder)
    source = tmp_path / "next.safetensors"
    save_file(tensors(1), str(source))

    def fail(self: AtomicFile) -> None:
        self.discard()
        raise failure

    monkeypatch.setattr(AtomicFile, "publish", fail)
    with pytest.raises(type(failure)):
        convert_checkpoint(source, folder, max_shard_size=10**9)
    assert contents(folder) == before


# --------------------------------------------------------------------------- files that are not the checkpoint


@pytest.mark.parametrize("shard", [10**9, SHARD], ids=["lone", "shards"])
def test_a_file_that_is_not_a_checkpoint_by_name_is_never_removed(tmp_path: Path, shard: int) -> None:
    folder = tmp_path / "lora"
    folder.mkdir()
    save_file(tensors(0), str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text("{}")
    before = contents(folder)
    source = tmp_path / "src.safetensors"
    save_file(tensors(1), str(source))
    with pytest.raises(MappingError, match=r"lora: holds files that are not a checkpoint.*adapter_model"):
        convert_checkpoint(source, folder, max_shard_size=shard)
    assert contents(folder) == before


def test_the_cli_refuses_a_lora_folder_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "lora"
    folder.mkdir()
    save_file(tensors(0), str(folder / "adapter_model.safetensors"))
    before = contents(folder)
    source = tmp_path / "src.safetensors"
    save_file(tensors(1), str(source))
    assert main(["convert", str(source), str(folder), "--max-shard-size", "1GB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {folder}: ") and "adapter_model.safetensors" in err
    assert contents(folder) == before


def test_shards_beside_an_index_leave_other_files_alone(tmp_path: Path) -> None:
    folder = sharded(tmp_path / "ckpt", tensors(0))
    save_file(tensors(2), str(folder / "adapter_model.safetensors"))
    adapter = (folder / "adapter_model.safetensors").read_bytes()
    source = tmp_path / "next.safetensors"
    save_file(tensors(1), str(source))
    convert_checkpoint(source, folder, max_shard_size=SHARD * 2)
    assert (folder / "adapter_model.safetensors").read_bytes() == adapter
    assert same(read(folder), tensors(1)) and len(listing(folder)) == 4  # the adapter, the index, two shards
    with pytest.raises(MappingError, match="adapter_model.safetensors beside its checkpoint"):
        convert_checkpoint(source, folder, max_shard_size=10**9)  # a lone file would leave no index
    assert (folder / "adapter_model.safetensors").read_bytes() == adapter and same(read(folder), tensors(1))


# --------------------------------------------------------------------------- an interrupted conversion, then another


def killed(folder: Path, source: Path, shard: int, at: str) -> None:
    """Convert ``source`` into ``folder`` in a process killed at ``at``: "park" (the first name it removes
    while parking, after the parked index is written), "link" (right after the first parked link) or
    "commit" (right after the commit)."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from weightmap import commit, convert_checkpoint
        die = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        at = {at!r}
        if at == "park":
            commit._Transaction._unlink = die
        elif at == "link":
            link = os.link
            def link_then_die(source, name, **kwargs):
                link(source, name, **kwargs)
                if name.endswith(".weightmap-old"):
                    die()
            os.link = link_then_die
        else:
            step = commit._Transaction.commit
            commit._Transaction.commit = lambda self, *args: (step(self, *args), die())
        convert_checkpoint({str(source)!r}, {str(folder)!r}, max_shard_size={shard})
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr


@pytest.mark.parametrize("at", ["park", "link", "commit"])
@pytest.mark.parametrize(("earlier", "shard"), [("lone", SHARD), ("shards", 10**9)],
                         ids=["lone to shards", "shards to lone"])
def test_a_conversion_after_a_killed_one_leaves_exactly_one_checkpoint(
    tmp_path: Path, earlier: str, shard: int, at: str
) -> None:
    folder = lone(tmp_path / "ckpt", tensors(0)) if earlier == "lone" else sharded(tmp_path / "ckpt", tensors(0))
    source = tmp_path / "next.safetensors"
    save_file(tensors(1), str(source))
    killed(folder, source, shard, at)
    assert same(read(folder), tensors(1) if at == "commit" else tensors(0))
    convert_checkpoint(source, folder, max_shard_size=shard)
    assert same(read(folder), tensors(1))
    want = {SINGLE} if shard > SHARD else {INDEX_NAME, *(f"model-0000{i}-of-00004.safetensors" for i in range(1, 5))}
    assert listing(folder) == want  # no earlier model.safetensors, shard or hidden name beside it
