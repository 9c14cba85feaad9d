"""What the CLI refuses to send, and answers it refuses to take as success: a name that
would reach another route ('/' or '..' in it), and a redirect (never followed; nothing
was done). Also when ``evaluate --promote`` left the version unserved."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from preft_serve.cli.client import CliError, Registry
from preft_serve.cli.evaluation import _check_promoted
from tests.support.cli import run_cli

NOWHERE = "http://127.0.0.1:9"  # nothing listens: a request sent would say "cannot reach"
KEY = ("--api-key", "pft_x.y")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["user", "unbind", "x/../../adapters/bot"], "user id 'x/../../adapters/bot' is invalid"),
        (["user", "show", ".."], "cannot be named in a URL path"),
        (["user", "bind", "alice", "../keys"], "adapter name '../keys' is invalid"),
        (["adapter", "delete", "bot/../../keys"], "adapter name"),
        (["files", "delete", "../keys/0a1b2c3d4e5f"], "file ids look like 'file-'"),
        (["fine-tune", "cancel", "ftjob-x?after=1"], "job ids look like 'ftjob-'"),
        (["tenant", "show", "a/b", "--admin-token", "t"], "tenant name 'a/b' is invalid"),
    ],
)
def test_a_name_that_would_reach_another_route_is_refused_before_sending(
    capsys: Any, argv: list[str], fragment: str
) -> None:
    code, out, err = run_cli(capsys, *argv, "--url", NOWHERE, *KEY)
    assert (code, out) == (2, ""), err
    assert fragment in err and "cannot reach" not in err, err


def test_the_client_sends_no_dot_segment() -> None:
    registry = Registry(NOWHERE, "pft_x.y", 5)
    for path in ("/v1/users/..", "/v1/users/./x", "/v1/files/../keys?limit=1"):
        with pytest.raises(CliError, match=re.escape("a '.' or '..' in a name")):
            registry.call("DELETE", path)


class _Redirects(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        self.send_response(307)
        self.send_header("Location", "https://gateway.example/v1/users/alice")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_PUT = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def redirecting() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Redirects)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_redirect_is_a_failure_naming_where_it_points(capsys: Any, redirecting: str) -> None:
    code, out, err = run_cli(capsys, "user", "bind", "alice", "bot", "--url", redirecting, *KEY)
    assert (code, out) == (1, "")
    assert f"{redirecting} answered HTTP 307, redirecting to https://gateway.example/" in err
    assert "nothing was done" in err and "--url" in err
    code, out, _ = run_cli(capsys, "--json", "user", "show", "alice", "--url", redirecting, *KEY)
    assert code == 1 and '"code": "redirected"' in out


def _run(**fields: Any) -> dict[str, Any]:
    result = {"score": 0.2, "serving_version": 1, "serving_score": 0.9, "margin": 0.05}
    return {"version": 2, "promoted": False, "promote_refused": None, "result": result, **fields}


def test_evaluate_promote_fails_unless_the_version_is_served() -> None:
    with pytest.raises(CliError, match=r"version 2 did not pass its evaluation \(score 0.2"):
        _check_promoted(_run(), "bot")
    with pytest.raises(CliError, match="passed its evaluation but was not promoted: changed"):
        _check_promoted(_run(promote_refused="changed"), "bot")
    _check_promoted(_run(promoted=True), "bot")  # served now
    served = _run(version=1)  # the run of the served version promotes nothing
    _check_promoted(served, "bot")
