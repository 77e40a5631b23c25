"""Run folders are never silently reused.

A new run into a folder that already holds a run is refused, with the choices: ``--resume`` to
continue it, another ``--name``, or ``--overwrite``, which moves the old files aside into
``NAME.replaced-STAMP`` (never deletes them). A lock file (``.vitkit-train.lock``, holding the
writer's PID and host) makes a second process on the same folder fail at once, naming the
holder; a lock whose process is gone is taken over.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from vitkit.errors import ConfigError, LockHeld

logger = logging.getLogger("vitkit")

LOCK = ".vitkit-train.lock"
# what a run writes: any of them means the folder holds a run
RUN_FILES = ("config.yaml", "state.pt", "last.safetensors", "best.safetensors", "metrics.csv",
             "train.log", "run.json", "doctor.json", "curves.png", "result.json")


def run_files(folder: Path) -> list[str]:
    """The files of a run that ``folder`` holds (empty for a new or empty folder)."""
    return [name for name in RUN_FILES if (folder / name).exists()]


@dataclass
class RunLock:
    """The lock of one run folder, held while a process writes it."""

    path: Path

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


def _holder(path: Path) -> tuple[int, str] | None:
    try:
        pid, host = path.read_text().split()[:2]
        return int(pid), host
    except (OSError, ValueError):
        return None


def _alive(pid: int, host: str) -> bool:
    if host != socket.gethostname():
        return True  # another machine's process: it cannot be checked from here
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock(folder: Path, *, name: str = LOCK, who: str = "vitkit train",
         instead: str = "give this run another --name") -> RunLock:
    """Take ``folder``'s lock (the file ``name``), or a :class:`LockHeld` naming the process
    that holds it (``who``) and what to do (``instead``)."""
    path = folder / name
    mine = f"{os.getpid()} {socket.gethostname()}\n"
    for _ in range(3):
        # the lock appears with its holder already written (a hard link of a written file):
        # a lock created empty and written after let a second process read it empty, take it
        # for stale and take it over while its holder ran
        tmp = folder / f"{name}.{os.getpid()}.tmp"
        tmp.write_text(mine)
        try:
            os.link(tmp, path)
        except FileExistsError:
            holder = _holder(path)
            if holder is not None and _alive(*holder):
                raise LockHeld(
                    f"{folder} is being written by another {who} (PID {holder[0]} on "
                    f"{holder[1]}); wait for it to finish, or {instead}. "
                    f"If no such run is going on, delete {path}") from None
            path.unlink(missing_ok=True)  # stale: its process is gone
            logger.info("took over the lock of %s: the process that held it is gone", folder)
            continue
        finally:
            tmp.unlink(missing_ok=True)
        return RunLock(path)
    raise LockHeld(f"cannot lock {folder}: another process keeps taking {path}")


def move_aside(folder: Path) -> Path:
    """Move everything in ``folder`` but its lock into a sibling ``NAME.replaced-STAMP``."""
    aside = folder.with_name(f"{folder.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while aside.exists():
        n += 1
        aside = folder.with_name(f"{folder.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
    aside.mkdir(parents=True)
    for entry in folder.iterdir():
        if entry.name != LOCK:
            os.replace(entry, aside / entry.name)
    return aside


def claim(folder: Path, *, resume: bool, overwrite: bool) -> tuple[RunLock, bool]:
    """Lock ``folder`` for a run (creating it), refusing a new run into a folder that holds
    one unless ``overwrite`` (the old files are moved aside). Returns the lock and whether the
    folder was created here."""
    for place in (folder, *folder.parents):
        if place.exists() and not place.is_dir():
            raise ConfigError(f"{place} is a file; a run needs a folder there (choose another "
                              "--out or --name)")
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    held = lock(folder)
    try:
        found = [] if resume else run_files(folder)
        if found and not overwrite:
            raise ConfigError(
                f"{folder} already holds a run ({', '.join(found)}); a new run would replace "
                f"it. Continue it with --resume {folder}, give the new run another --name, or "
                "pass --overwrite to move the old files aside (nothing is deleted)")
        if found:
            aside = move_aside(folder)
            logger.warning("moved the run that was in %s to %s (--overwrite)", folder, aside)
    except BaseException:
        held.release()
        raise
    return held, created
