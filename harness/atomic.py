"""The harness's one way of writing a file: a temporary file beside it, fsync, rename, fsync the directory.

Every file the harness writes (records, samples, events, plans, figures, reports) goes
through :func:`write_atomic`, so a reader never sees half a file, an interrupted or
failed write leaves the previous file as it was, and a written file survives a crash.
Checkpoints are written by :func:`weightmap.format.write_checkpoint`, which does the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from harness.errors import OutputError

__all__ = ["write_atomic", "write_json"]


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory; the rename still happened
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` (``str`` as UTF-8) to ``path`` atomically and durably; returns the path.

    Parent directories are created. Raises :class:`~harness.errors.OutputError` naming the
    path and the system's reason (read-only, no space left, ...); the previous file, if any,
    is then unchanged and no temporary file is left behind.
    """
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp: str | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        tmp = None
        _fsync_directory(target.parent)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise OutputError(f"{target}: cannot write ({reason}); any earlier file there is unchanged") from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return target


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """``data`` as indented JSON, written with :func:`write_atomic`."""
    return write_atomic(path, json.dumps(data, indent=1) + "\n")
