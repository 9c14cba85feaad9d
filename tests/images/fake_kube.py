"""A Kubernetes API server just large enough for the registry's fine-tuning backend, with a
kubelet that runs each Job's pod from the trainer image (:mod:`tests.images.pods`).

The registry reaches it exactly as in a cluster: in-cluster configuration from
KUBERNETES_SERVICE_HOST/PORT and the mounted service account (token, ca.crt), over TLS.
It answers the calls ``KubernetesRunner`` makes: create a Job, read its status, list the
Job's pods, read the trainer's log, delete the Job; anything else is a 404 Status and is
recorded, so a test sees an unexpected call.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.support.processes import ServiceProcess

TOKEN = "fake-service-account-token"


@dataclass
class JobRun:
    manifest: dict[str, Any]
    process: ServiceProcess | None = None
    exit_code: int | None = None


@dataclass
class FakeKube:
    """``start_pod(job_manifest) -> ServiceProcess`` runs a Job's pod (the kubelet's part)."""

    start_pod: Callable[[dict[str, Any]], ServiceProcess]
    certs: Path
    jobs: dict[str, JobRun] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    unauthorised: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0
    server: ThreadingHTTPServer | None = None

    def service_account(self, namespace: str) -> Path:
        """What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount."""
        folder = self.certs / "serviceaccount"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "token").write_text(TOKEN)
        (folder / "namespace").write_text(namespace)
        (folder / "ca.crt").write_bytes((self.certs / "tls.crt").read_bytes())
        return folder

    def start(self) -> None:
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=kubernetes",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(self.certs / "tls.key"),
                "-out",
                str(self.certs / "tls.crt"),
            ],
            capture_output=True,
            check=True,
        )
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.handle(self, "GET")

            def do_POST(self) -> None:
                fake.handle(self, "POST")

            def do_DELETE(self) -> None:
                fake.handle(self, "DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certs / "tls.crt", self.certs / "tls.key")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
        for run in self.jobs.values():
            if run.process is not None:
                run.process.stop(10)

    # -- the API -----------------------------------------------------------------------------

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(req.path)
        scheme, _, token = (req.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or token != TOKEN:  # the client sends "bearer"
            self.unauthorised.append(f"{method} {url.path}")
            return _reply(req, 401, _status(401, "Unauthorized"))
        length = int(req.headers.get("Content-Length") or 0)
        body = json.loads(req.rfile.read(length)) if length else None
        jobs = re.fullmatch(
            r"/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?(/status)?", url.path
        )
        pods = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)/log)?", url.path)
        with self.lock:
            if jobs and method == "POST" and not jobs.group(2) and body is not None:
                return self._create(req, body)
            if jobs and jobs.group(2) and method == "GET":
                return self._job(req, jobs.group(2))
            if jobs and jobs.group(2) and method == "DELETE":
                run = self.jobs.pop(jobs.group(2), None)
                if run and run.process:
                    run.process.stop(10)
                return _reply(req, 200 if run else 404, _status(200 if run else 404, "gone"))
            if pods and not pods.group(2) and method == "GET":
                return self._pods(req, parse_qs(url.query).get("labelSelector", [""])[0])
            if pods and pods.group(2) and method == "GET":
                return self._log(req, pods.group(2))
        self.unexpected.append(f"{method} {req.path}")
        _reply(req, 404, _status(404, "not served by the fake API"))

    def _create(self, req: BaseHTTPRequestHandler, job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        run = JobRun(job)
        self.jobs[name] = run
        run.process = self.start_pod(job)
        _reply(req, 201, job)

    def _refresh(self, run: JobRun) -> None:
        if run.exit_code is None and run.process is not None and run.process.proc is not None:
            run.exit_code = run.process.proc.poll()

    def _job(self, req: BaseHTTPRequestHandler, name: str) -> None:
        run = self.jobs.get(name)
        if run is None:
            return _reply(req, 404, _status(404, f"jobs.batch {name} not found"))
        self._refresh(run)
        status: dict[str, Any] = {"active": 1}
        if run.exit_code == 0:
            status = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
        elif run.exit_code is not None:
            status = {
                "failed": 1,
                "conditions": [
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
                ],
            }
        _reply(req, 200, {**run.manifest, "status": status})

    def _pods(self, req: BaseHTTPRequestHandler, selector: str) -> None:
        key, _, value = selector.partition("=")
        items = []
        for name, run in self.jobs.items():
            labels = run.manifest["spec"]["template"]["metadata"]["labels"]
            if labels.get(key) != value:
                continue
            self._refresh(run)
            state: dict[str, Any] = {"running": {}}
            if run.exit_code is not None:
                state = {
                    "terminated": {
                        "exitCode": run.exit_code,
                        "reason": "Completed" if run.exit_code == 0 else "Error",
                    }
                }
            items.append(
                {
                    "metadata": {"name": f"{name}-pod", "labels": labels},
                    "status": {
                        "containerStatuses": [
                            {
                                "name": "trainer",
                                "state": state,
                                "ready": False,
                                "restartCount": 0,
                                "image": "",
                                "imageID": "",
                            }
                        ]
                    },
                }
            )
        _reply(req, 200, {"kind": "PodList", "apiVersion": "v1", "items": items, "metadata": {}})

    def _log(self, req: BaseHTTPRequestHandler, pod: str) -> None:
        run = self.jobs.get(pod.removesuffix("-pod"))
        if run is None or run.process is None:
            return _reply(req, 404, _status(404, "no such pod"))
        text = run.process.log_path.read_text(errors="replace")
        _reply(req, 200, text, content_type="text/plain")


def _status(code: int, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "message": message,
        "reason": "NotFound" if code == 404 else "Unknown",
    }


def _reply(
    req: BaseHTTPRequestHandler, code: int, body: Any, content_type: str = "application/json"
) -> None:
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    req.send_response(code)
    req.send_header("Content-Type", content_type)
    req.send_header("Content-Length", str(len(data)))
    req.end_headers()
    req.wfile.write(data)
