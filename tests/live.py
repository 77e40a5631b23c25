"""A real explorer server for the tests: uvicorn in a thread on a free loopback port."""

from __future__ import annotations

import contextlib
import threading
import time

import uvicorn

from vitkit.commands.explore import bind
from vitkit.web.app import create_app
from vitkit.web.samples import sample_table

TOKEN = "test-token-0123456789"


@contextlib.contextmanager
def serve(explorer, images=None, audit=None, compare=None, **options):
    """Serve ``explorer`` (with the samples of ``images`` and ``audit`` folders); yields the
    base URL (http://127.0.0.1:PORT)."""
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    app = create_app(explorer, token=TOKEN, host="127.0.0.1", port=port,
                     samples=sample_table(images, audit), compare=compare, **options)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
