"""Writing a file so that a reader sees the whole old one or the whole new one, never half."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: int = 0o644) -> Iterator[BinaryIO]:
    """A new file at a fresh, unguessable name beside `path` (created exclusively, so no link is
    followed), renamed over `path` when the block ends; removed if the block raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # the rename must not reach the disk before the bytes do
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], mode: int = 0o644) -> Iterator[Path]:
    """atomic_file for a writer that opens its file by name (the gguf writer): a fresh name beside
    `path`, whose file is synced and renamed over `path` when the block ends, removed if it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, mode)
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_atomically(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    with atomic_file(path, mode) as f:
        f.write(data)
