"""The errors vitkit raises for a user's mistake: a bad option, file, image, config, path, network
or disk condition. Each message says what was expected, what was found and what to do; the CLI
prints it in one or two lines and exits with code 2. Anything else is a bug in vitkit.

They subclass ``ValueError``, as Python's own argument errors do, so a caller of the library can
catch a bad argument either way. The CLI does not: it turns only these (and the operating
system's errors about the user's files) into a message with exit code 2, so a plain
``ValueError`` raised anywhere else is a bug and reaches the user as one (a traceback, exit 1).
"""

from __future__ import annotations


class VitkitError(ValueError):
    """A user's mistake or an unusable input; the message says what to do."""


class CheckpointError(VitkitError):
    """A checkpoint that cannot be read, does not fit, or cannot be written in a format."""


class MissingBlocks(CheckpointError):
    """A checkpoint whose transformer blocks are not all there: a gap in the block indices, or
    fewer blocks than its config states. ``missing`` holds the absent indices, ``found`` the
    number present. Loading it would silently give a different, shallower model."""

    def __init__(self, message: str, missing: list[int], found: int) -> None:
        super().__init__(message)
        self.missing, self.found = missing, found


class ModelError(VitkitError):
    """A model that cannot be built or run as asked: an unknown name, an option out of range,
    an input the patches do not tile."""


class ExplainError(VitkitError):
    """A map, method or layer asked of a model or input that cannot give it."""


class ConfigError(VitkitError):
    """A training option or config file with a wrong name, type or value."""


class LockHeld(VitkitError):
    """A run folder (or a study's claim on a run) that another live vitkit process holds."""


class WorkerFailed(VitkitError):
    """A worker process of a study stopped; every finished run is kept."""


class OverBudget(VitkitError):
    """An int8 model that loses more accuracy than its budget allows; nothing was written."""


class DataError(VitkitError):
    """Data that cannot be read or trained on (a missing folder, an empty class, a failed
    download)."""


class ImageError(DataError):
    """One image that cannot be read (corrupt, not an image, too large)."""


class StorageError(VitkitError):
    """A file that could not be written (no space left, not writable); what was written before
    is intact."""
