"""A client whose idle connections expire after 5 s (httpx's and the openai SDK's default)
never sends on a connection the service has just closed: the services keep idle
connections open longer (``KEEPALIVE_S``). With uvicorn's own 5 s the two timers race and
a request now and then dies with a reset (the chaos soak caught one as a ReadError)."""

from __future__ import annotations

import http.client
import sys
import time
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.processes import running_http_service

CLIENT_IDLE_S = 5.5  # just past httpx's default keepalive_expiry and uvicorn's default


def _get(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/healthz")
    reply = conn.getresponse()
    reply.read()
    return reply.status


@pytest.mark.parametrize(("keepalive", "kept"), [(None, True), ("2", False)])
def test_an_idle_connection_outlives_the_clients_idle_timeout(
    tmp_path: Path, redis_server: str, keepalive: str | None, kept: bool
) -> None:
    port = free_port()
    env = {
        "PREFT_GATEWAY_REDIS_URL": redis_server,
        "PREFT_GATEWAY_PORT": str(port),
        "PREFT_GATEWAY_WORKER_URLS": '["http://127.0.0.1:9"]',
        "PREFT_GATEWAY_LOG_LEVEL": "WARNING",
        **({"PREFT_GATEWAY_KEEPALIVE_S": keepalive} if keepalive else {}),
    }
    with running_http_service(
        "gateway",
        [sys.executable, "-m", "preft_serve.gateway"],
        tmp_path,
        f"http://127.0.0.1:{port}",
        env,
        timeout=90,
    ):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        assert _get(conn) == 200
        first = conn.sock
        time.sleep(CLIENT_IDLE_S)
        try:
            again = _get(conn) == 200 and conn.sock is first
        except (http.client.HTTPException, ConnectionError):
            again = False  # the server had closed it: the reset a client would see
        conn.close()
        # The default keeps the connection; a keep-alive below the client's idle time (the
        # setting is read, and the test can tell) closes it.
        assert again is kept
