"""``python -m preft_serve.localstack`` (``make run``): the whole service on this machine.

Generates the demo model and adapters, starts a private redis-server, the registry, one
CPU worker and the gateway (each its own process, logs under ``<var>/run/logs/``), creates
a demo tenant with adapters in both modes and bound users, sends one chat completion
through the gateway, prints copy-paste examples, and runs until Ctrl-C or SIGTERM, which
stop the parts in reverse order. Exit status: 0 after a clean stop, 1 if a part failed.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from preft_serve.localstack.demo import examples, first_reply, seed_demo
from preft_serve.localstack.processes import StackError
from preft_serve.localstack.stack import LocalStack, StackConfig

READY_LINE = "preft-serve local stack is ready. Ctrl-C stops it."


class _Stop(BaseException):
    """Ctrl-C or SIGTERM: stop the stack and exit 0 (a BaseException, like KeyboardInterrupt,
    so no `except Exception` on the way swallows it)."""


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    raise _Stop(signal.Signals(signum).name)


def say(line: str) -> None:
    print(line, flush=True)


def parser() -> argparse.ArgumentParser:
    d = StackConfig()
    p = argparse.ArgumentParser(prog="python -m preft_serve.localstack", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--var", type=Path, default=d.var,
                   help="state directory: demo model in VAR/demo, logs and data in VAR/run "
                   "(default: var)")
    p.add_argument("--redis-port", type=int, default=d.redis_port,
                   help="(default %(default)s)")
    p.add_argument("--registry-port", type=int, default=d.registry_port,
                   help="(default %(default)s)")
    p.add_argument("--worker-port", type=int, default=d.worker_port,
                   help="(default %(default)s)")
    p.add_argument("--gateway-port", type=int, default=d.gateway_port,
                   help="(default %(default)s)")
    p.add_argument("--object-store", metavar="URL",
                   help="s3://bucket[/prefix] (credentials from AWS_* variables) or a "
                   "directory (default: VAR/run/objects)")
    p.add_argument("--s3-endpoint-url", metavar="URL",
                   help="S3-protocol endpoint, e.g. MinIO or moto (default: AWS)")
    p.add_argument("--worker-args", default="", metavar="'FLAGS'",
                   help="extra flags for the worker (and vLLM), one shell-quoted string")
    p.add_argument("--exit-after-demo", action="store_true",
                   help="stop everything once the examples are printed (tests, CI)")
    return p


def config_from(args: argparse.Namespace) -> StackConfig:
    if args.s3_endpoint_url and not (args.object_store or "").startswith("s3://"):
        raise StackError("--s3-endpoint-url needs --object-store s3://bucket[/prefix]")
    return StackConfig(
        var=args.var, redis_port=args.redis_port, registry_port=args.registry_port,
        worker_port=args.worker_port, gateway_port=args.gateway_port,
        object_store=args.object_store, s3_endpoint_url=args.s3_endpoint_url,
        worker_args=shlex.split(args.worker_args),
    )


def bring_up(stack: LocalStack) -> None:
    """Everything up to the printed examples."""
    from preft_serve.worker.demo import prepare  # imports torch: only when needed

    var = stack.config.var
    stack.check_ports()
    say(f"[1/6] demo model and adapters in {var / 'demo'}")
    model, adapters = prepare(var / "demo")
    model = model.resolve()
    say("[2/6] worker (vLLM loads in the background, about a minute on CPU)")
    stack.start_worker(model)
    say("[3/6] redis and registry")
    stack.start_redis()
    stack.start_registry(model)
    say(f"[4/6] demo tenant, adapters uploaded through {stack.registry_url}, users bound")
    tenant = seed_demo(stack, adapters)
    say("[5/6] waiting for the worker, then the gateway")
    waited = stack.wait_worker()
    say(f"  worker: healthy at {stack.worker_url} (after {waited:.0f} s more)")
    stack.start_gateway(model)
    say(f"  gateway: ready at {stack.gateway_url}")
    say("[6/6] one chat completion through the gateway (user alice)")
    reply = first_reply(stack, tenant.api_key)
    content = reply["choices"][0]["message"]["content"]  # type: ignore[index]
    say(f"  model {reply['model']!r} answered {content!r} (random demo model: gibberish "
        "is expected)")
    say(examples(stack, tenant))


def wait_until_stopped(stack: LocalStack) -> None:
    while True:
        dead = stack.dead_child()
        if dead is not None:
            raise dead.failure(f"exited unexpectedly with status {dead.proc.returncode}")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    code = 0
    stack: LocalStack | None = None
    try:
        stack = LocalStack(config_from(args), say)
        bring_up(stack)
        if args.exit_after_demo:
            say("--exit-after-demo: stopping")
        else:
            say(READY_LINE)
            wait_until_stopped(stack)
    except _Stop as exc:
        say(f"\n{exc}: stopping")
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        # A second Ctrl-C must not cut the orderly stop short.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        if stack is not None:
            stack.stop()
    say("stopped" if code == 0 else "stopped after an error")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
