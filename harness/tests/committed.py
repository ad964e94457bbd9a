"""The files of ``results/`` as committed, for tests that check committed results (against the README, against
a rule every record follows): the ``bench-*`` targets rewrite ``results/`` in the working tree, and a rerun's
uncommitted results must not turn such a test red, nor let it pass on figures nobody committed.

:func:`committed_copy` extracts them from git's ``HEAD``; where the repository root is no git checkout of its
own (a copy of the tree without ``.git``), the files there are what was shipped, and are copied as they are.
"""

from __future__ import annotations

import fnmatch
import io
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ROOT", "committed_copy", "committed_paths"]

ROOT = Path(__file__).resolve().parents[2]


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False, timeout=60)


def _is_checkout(root: Path) -> bool:
    """Whether ``root`` is the top of a git checkout with a commit (not a folder inside another one's tree)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top.returncode != 0 or Path(top.stdout.decode().strip()).resolve() != root.resolve():
        return False
    return _git(root, "rev-parse", "--verify", "--quiet", "HEAD").returncode == 0


def committed_paths(pattern: str, root: Path = ROOT) -> list[str]:
    """The paths (relative to ``root``, sorted) of ``HEAD``'s files that match the glob ``pattern``
    (``results/*/summary.json``: ``*`` stays within one folder); where ``root`` is no git checkout, of the files in
    ``root`` as they are."""
    if not _is_checkout(root):
        return sorted(path.relative_to(root).as_posix() for path in root.glob(pattern) if path.is_file())
    listed = _git(root, "ls-tree", "-r", "--name-only", "-z", "HEAD")
    if listed.returncode != 0:
        raise RuntimeError(f"git ls-tree in {root}: {listed.stderr.decode().strip()}")
    return sorted(name for name in listed.stdout.decode().split("\0") if name and _matches(name, pattern))


def _matches(path: str, pattern: str) -> bool:
    """Whether ``path`` matches the glob ``pattern`` folder by folder, as :meth:`Path.glob` finds it."""
    parts, wanted = path.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted, strict=True))


def committed_copy(paths: Sequence[str], into: Path, root: Path = ROOT) -> Path:
    """``HEAD``'s files under each of ``paths`` (relative to ``root``; a path ``HEAD`` lacks is left out),
    written under ``into`` at the same relative paths; returns ``into``. Where ``root`` is no git checkout, the
    files under ``paths`` in ``root`` as they are."""
    into.mkdir(parents=True, exist_ok=True)
    if not _is_checkout(root):
        for path in paths:
            source = root / path
            if source.is_dir():
                shutil.copytree(source, into / path, dirs_exist_ok=True)
            elif source.is_file():
                (into / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, into / path)
        return into
    listed = _git(root, "ls-tree", "-r", "--name-only", "-z", "HEAD", "--", *paths)
    if listed.returncode != 0:
        raise RuntimeError(f"git ls-tree in {root}: {listed.stderr.decode().strip()}")
    files = [name for name in listed.stdout.decode().split("\0") if name]
    if not files:
        return into
    archive = _git(root, "archive", "--format=tar", "HEAD", "--", *files)
    if archive.returncode != 0:
        raise RuntimeError(f"git archive in {root}: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 on: refuse links and paths out of ``into``
            tar.extractall(into, filter="data")
        else:  # an earlier 3.11; the archive is this repository's own commit
            tar.extractall(into)
    return into
