"""``python -m preft_serve.onebox`` (what ``make run`` runs), as a real subprocess.

One stack start: wait for the ready line, run the curl and openai examples it printed
(exactly as printed, through bash) on the --toy stack, check the gateway routed to the bound
adapter by asking the worker directly for that adapter's hash, then Ctrl-C (SIGINT) and check a
clean exit with every part's process group gone and every port closed.
"""

from __future__ import annotations

import json
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from preft_serve.onebox.__main__ import READY_LINE
from tests.onebox.procs import group_members
from tests.support.ports import free_port

START_TIMEOUT_S = 600


@dataclass
class RunningStack:
    proc: subprocess.Popen[str]
    ports: dict[str, int]
    var: Path
    lines: list[str] = field(default_factory=list)
    _queue: queue.Queue[str | None] = field(default_factory=queue.Queue)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def read_until(self, marker: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {marker!r} after {timeout} s:\n{self.output[-6000:]}")
            if line is None:
                pytest.fail(
                    f"exited with {self.proc.wait()} before {marker!r}:\n{self.output[-6000:]}"
                )
            self.lines.append(line)
            if marker in line:
                return

    def drain(self) -> None:
        """Collect the rest of the output (the process has exited)."""
        while (line := self._queue.get(timeout=30)) is not None:
            self.lines.append(line)


def _pump(stream: object, sink: queue.Queue[str | None]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        sink.put(line.rstrip("\n"))
    sink.put(None)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    var = tmp_path_factory.mktemp("onebox")
    ports = {name: free_port() for name in ("redis", "registry", "worker", "gateway")}
    argv = [
        sys.executable,
        "-m",
        "preft_serve.onebox",
        "--var",
        str(var),
        *[a for name, port in ports.items() for a in (f"--{name}-port", str(port))],
        "--toy",
        "--worker-args",
        "--max-num-seqs 8",
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    running = RunningStack(proc, ports, var)
    threading.Thread(target=_pump, args=(proc.stdout, running._queue), daemon=True).start()
    try:
        running.read_until(READY_LINE, START_TIMEOUT_S)
        yield running
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()


def _curl_command(output: str) -> str:
    """The printed chat-completion curl: from ``curl`` through its continuation lines."""
    lines = output.splitlines()
    start = next(
        i
        for i, line in enumerate(lines)
        if line.startswith("curl ") and "/v1/chat/completions" in line
    )
    end = start
    while lines[end].endswith("\\"):
        end += 1
    return "\n".join(lines[start : end + 1])


def _heredoc(output: str) -> str:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("<<'EOF'"))
    end = lines.index("EOF", start)
    return "\n".join(lines[start : end + 1])


def _api_key(output: str) -> str:
    match = re.search(r"API key (pft_\S+)", output)
    assert match, output
    return match.group(1)


def test_printed_examples_work_against_the_running_stack(stack: RunningStack) -> None:
    gateway = f"http://127.0.0.1:{stack.ports['gateway']}"
    registry = f"http://127.0.0.1:{stack.ports['registry']}"
    worker = f"http://127.0.0.1:{stack.ports['worker']}"
    curl = _curl_command(stack.output)
    assert gateway in curl

    done = subprocess.run(
        ["bash", "-c", curl], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["model"] == "alice-prefill"
    assert reply["usage"]["completion_tokens"] > 0
    content = reply["choices"][0]["message"]["content"]
    # The start-up request (same body, greedy) printed the same text.
    assert f"answered {content!r}" in stack.output

    # The gateway used alice's bound adapter: the worker gives the same text for its hash.
    key = _api_key(stack.output)
    binding = httpx.get(
        f"{registry}/v1/users/alice", timeout=30, headers={"Authorization": f"Bearer {key}"}
    )
    assert binding.status_code == 200, binding.text
    args = shlex.split(curl.replace("\\\n", " "))
    body = json.loads(args[args.index("-d") + 1])
    direct = httpx.post(
        f"{worker}/v1/chat/completions",
        timeout=120,
        json={**body, "model": f"sha256:{binding.json()['sha256']}"},
    )
    assert direct.status_code == 200, direct.text
    assert direct.json()["choices"][0]["message"]["content"] == content


def test_the_printed_admin_token_opens_the_gateways_operator_view(stack: RunningStack) -> None:
    """The local stack's gateway serves the operator routes to the admin token it prints
    (the console's operator view), and to no tenant key."""
    gateway = f"http://127.0.0.1:{stack.ports['gateway']}"
    match = re.search(r"admin token (\S+)", stack.output)
    assert match, stack.output
    workers = httpx.get(
        f"{gateway}/v1/operator/workers",
        timeout=30,
        headers={"Authorization": f"Bearer {match.group(1)}"},
    )
    assert workers.status_code == 200, workers.text
    (worker,) = workers.json()["data"]
    assert worker["url"] == f"http://127.0.0.1:{stack.ports['worker']}"
    as_tenant = httpx.get(
        f"{gateway}/v1/operator/workers",
        timeout=30,
        headers={"Authorization": f"Bearer {_api_key(stack.output)}"},
    )
    assert as_tenant.status_code == 401, as_tenant.text


def test_printed_openai_example_reaches_every_demo_user(stack: RunningStack) -> None:
    done = subprocess.run(
        ["bash", "-c", _heredoc(stack.output)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    served = {line.split()[0]: line.split()[1] for line in lines[:5]}
    assert served == {
        "alice": "alice-prefill",
        "bob": "bob-prefill",
        "carol": "carol-all",
        "dave": "dave-direft",
        "erin": "erin-loreft",
    }
    # Different adapters, different greedy replies (the demo shows that adapters matter).
    assert len({line.split(" ", 2)[2] for line in lines[:5]}) == 5
    assert lines[5].startswith("erin (streamed): ") and len(lines[5]) > len("erin (streamed): ''")


def test_ctrl_c_stops_everything_cleanly(stack: RunningStack) -> None:
    pids = [int(p) for p in re.findall(r"started \(pid (\d+)\)", stack.output)]
    assert len(pids) == 4
    stack.proc.send_signal(signal.SIGINT)
    assert stack.proc.wait(120) == 0
    stack.drain()
    assert "Traceback" not in stack.output
    stopped = [line.split(":")[0].strip() for line in stack.lines if line.endswith(": stopped")]
    assert stopped == ["gateway", "worker", "registry", "redis"]
    for pid in pids:
        assert group_members(pid) == [], f"processes of group {pid} are still running"
    assert [name for name, port in stack.ports.items() if _port_open(port)] == []
