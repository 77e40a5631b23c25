"""The errors vitkit raises for a user's mistake: a bad option, file, image, config, path, network
or disk condition. Each message says what was expected, what was found and what to do; the CLI
prints it in one or two lines and exits with code 2. Anything else is a bug in vitkit.

They subclass ``ValueError`` so code written against earlier versions keeps catching them.
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


class ConfigError(VitkitError):
    """A training option or config file with a wrong name, type or value."""


class DataError(VitkitError):
    """Data that cannot be read or trained on (a missing folder, an empty class, a failed
    download)."""


class ImageError(DataError):
    """One image that cannot be read (corrupt, not an image, too large)."""


class StorageError(VitkitError):
    """A file that could not be written (no space left, not writable); what was written before
    is intact."""
