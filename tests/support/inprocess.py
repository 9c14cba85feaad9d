"""An ASGI app served over real loopback HTTP from this process (uvicorn in a thread), for
tests that need real connections (client disconnects, CLIs that take a URL, API fuzzing)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from tests.support.ports import free_port


def serve_in_thread(app: object) -> tuple[uvicorn.Server, threading.Thread, str]:
    """Run ``app`` under uvicorn on a free port in a daemon thread; returns its URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,  # type: ignore[arg-type]
            log_level="warning",
            lifespan="on",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


@contextmanager
def serving(app: object) -> Iterator[str]:
    """:func:`serve_in_thread` as a context manager: yields the URL, stops the server."""
    server, thread, url = serve_in_thread(app)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
