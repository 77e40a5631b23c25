"""The explorer's memory: a least-recently-used cache bounded both in bytes and in entries.

Values are whatever the explorer computed (an analysed image, a map, the curves); their size is
estimated by :func:`nbytes` when they are stored. Past either bound, the least recently used
entries go first, but the newest one always stays: an entry larger than the whole budget is
kept until the next one arrives, so the value just computed can still be answered.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np
import torch

log = logging.getLogger("vitkit")


class LRU:
    """A thread-safe least-recently-used cache holding at most ``max_bytes`` (as counted by the
    sizes given to :meth:`put`) and ``max_entries`` values. ``bytes`` is the current total."""

    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._items: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    def get(self, key: Hashable):
        """The value stored under ``key`` (now the most recently used), or None."""
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key][0]

    def put(self, key: Hashable, value, nbytes: int) -> None:
        """Store ``value`` (``nbytes`` bytes) under ``key``, then evict the least recently used
        entries until both bounds hold again (the new entry is never evicted)."""
        with self._lock:
            if key in self._items:
                self.bytes -= self._items.pop(key)[1]
            self._items[key] = (value, nbytes)
            self.bytes += nbytes
            while len(self._items) > 1 and self._over():
                _, (_, size) = self._items.popitem(last=False)
                self.bytes -= size

    def _over(self) -> bool:
        return self.bytes > self.max_bytes or len(self._items) > self.max_entries

    def __len__(self) -> int:
        return len(self._items)


def nbytes(value) -> int:
    """Approximate memory of a value to cache: tensors and arrays by their data, dicts, lists
    and tuples by their items plus 1 KB, anything else 1 KB."""
    if isinstance(value, torch.Tensor):
        return value.element_size() * value.nelement()
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values()) + 1024
    if isinstance(value, list | tuple):
        return sum(nbytes(v) for v in value) + 1024
    return 1024


def cache_budget(cache_mb: float, view_bytes: int) -> int:
    """The cache's bound in bytes: ``cache_mb`` MB, raised (with a warning) to three images'
    maps of ``view_bytes`` each when smaller. One image's maps, its model view and a few
    results must fit, or every image would be evicted by its own results."""
    limit = int(cache_mb * 2**20)
    if limit < 3 * view_bytes:
        limit = 3 * view_bytes
        log.warning("the cache of %d MB cannot hold one image's maps (%d MB); it holds "
                    "%d MB instead (--cache-mb)", cache_mb, view_bytes // 2**20,
                    limit // 2**20)
    return limit
