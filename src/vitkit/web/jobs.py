"""The explorer's slow work as background jobs: started by one request, followed by others
(progress, time left), cancelled on request, and superseded by a newer job for the same panel.

One worker thread runs the jobs one at a time, each under the explorer's model lock (the model
and its hooks are shared). A job's function takes a ``progress(fraction)`` callback and calls
it between its steps (with, optionally, a first part of the answer to show at once); the
callback raises :class:`Cancelled` once the job was cancelled or
superseded, so a cancel takes effect at the next step. Nothing here knows about HTTP.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("vitkit")
KEEP = 64  # finished jobs remembered (their results are in the explorer's cache too)


class Cancelled(Exception):
    """Raised inside a job's function by ``progress`` once the job is cancelled."""


@dataclass
class Job:
    """One piece of slow work: ``panel`` (what it fills on the page; a newer job for it cancels
    this one), ``state`` ("queued", "running", "done", "cancelled", "error"), ``fraction``
    done, and the ``result`` or ``error``."""

    id: str
    panel: str
    run: Callable[[Callable[[float], None]], object]
    state: str = "queued"
    fraction: float = 0.0
    started: float | None = None
    result: object = None
    partial: object = None  # what the job could already show, JSON-ready
    error: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)

    def progress(self, fraction: float, partial: object = None) -> None:
        """Record the fraction done (and a first part of the answer the page can show before
        the rest); raise :class:`Cancelled` once the job was cancelled."""
        if self.cancel.is_set():
            raise Cancelled(self.id)
        self.fraction = min(max(float(fraction), 0.0), 1.0)
        if partial is not None:
            self.partial = partial

    @property
    def eta(self) -> float | None:
        """Seconds left, from the time so far and the fraction done (None before any)."""
        if self.state != "running" or self.started is None or self.fraction <= 0:
            return None
        spent = time.perf_counter() - self.started
        return spent * (1 - self.fraction) / self.fraction

    def summary(self) -> dict:
        return dict(id=self.id, panel=self.panel, state=self.state,
                    fraction=round(self.fraction, 4), eta_s=self.eta, error=self.error)


class Jobs:
    """The job queue of one explorer; ``lock`` is its model lock."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.jobs: dict[str, Job] = {}
        self.latest: dict[str, Job] = {}  # panel -> its newest job
        self.queue: queue.Queue[Job] = queue.Queue()
        self.ids = itertools.count(1)
        self.guard = threading.Lock()
        self.worker = threading.Thread(target=self._work, name="vitkit-jobs", daemon=True)
        self.worker.start()

    def submit(self, panel: str, run: Callable[[Callable[[float], None]], object]) -> Job:
        """Queue ``run(progress)`` for ``panel``, cancelling the panel's previous job."""
        with self.guard:
            old = self.latest.get(panel)
            if old is not None and old.state in ("queued", "running"):
                old.cancel.set()
            job = Job(f"j{next(self.ids)}", panel, run)
            self.jobs[job.id] = job
            self.latest[panel] = job
            for stale in list(self.jobs)[:-KEEP]:
                if self.jobs[stale].state not in ("queued", "running"):
                    del self.jobs[stale]
        self.queue.put(job)
        return job

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def cancel(self, job_id: str) -> Job | None:
        job = self.jobs.get(job_id)
        if job is not None and job.state in ("queued", "running"):
            job.cancel.set()
            if job.state == "queued":
                job.state = "cancelled"
        return job

    def _work(self) -> None:
        while True:
            job = self.queue.get()
            if job.cancel.is_set():
                job.state = "cancelled"
                continue
            job.state, job.started = "running", time.perf_counter()
            try:
                with self.lock:
                    job.result = job.run(job.progress)
                job.fraction, job.state = 1.0, "done"
            except Cancelled:
                job.state = "cancelled"
            except Exception as err:  # the job's own error, shown on the page
                job.state, job.error = "error", str(err) or type(err).__name__
                if not isinstance(err, ValueError):
                    log.exception("explorer job %s (%s) failed", job.id, job.panel)
