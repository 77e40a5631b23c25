"""Atomic writes: every file goes to a temporary name beside its destination and is renamed into
place, so a crash or a full disk never leaves a half-written file. Used by the checkpoints, the
training runs, the reports and the commands alike."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from vitkit.errors import StorageError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # what open() would give: the user's umask, not mkstemp's 0600


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place.

    The file gets the permissions of the user's umask. When the disk fills up (an ``OSError``
    ENOSPC, or torch's "unexpected pos" from a short write), the temporary file is removed,
    ``path`` keeps its previous content, and a :class:`~vitkit.errors.StorageError` says so.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if _disk_full(err, path):
            kept = "keeps its previous content" if path.exists() else "was not written"
            raise StorageError(
                f"no space left on the device while writing {path}; {path.name} {kept} and "
                "every file written before is intact. Free some space and run again (a training "
                "run continues from its last good checkpoint with --resume RUN_FOLDER)") from err
        if isinstance(err, OSError) and err.filename == str(tmp):  # name the destination
            raise type(err)(err.errno, err.strerror, str(path)) from err
        raise
    return path


def _disk_full(err: BaseException, path: Path) -> bool:
    if isinstance(err, OSError):
        return err.errno == errno.ENOSPC
    text = str(err)
    return ("unexpected pos" in text  # torch.save's short write
            or "No space left on device" in text or "code: 28" in text)  # safetensors (Rust)


def remove_stale_temporaries(folder: Path, name: str) -> list[Path]:
    """Delete the temporaries :func:`atomic_write` leaves when a process is killed mid-write
    (``.NAME.xxxx``); returns what was removed."""
    stale = [p for p in Path(folder).glob(f".{name}.*") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale
