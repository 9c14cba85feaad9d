"""``/v1/responses`` through the gateway on a real worker (vLLM's Responses server): the
adapter bound to the user runs, the answer is the one the same conversation gets from
``/v1/chat/completions`` (greedy), and it names the adapter, not its content address."""

from __future__ import annotations

import httpx
from openai import OpenAI

from preft_serve.adapters.format import AdapterMode
from preft_serve.toymodels import LoraSpec, make_lora_adapter
from tests.e2e.stack import BASE_NAME, Base, Registry
from tests.support.processes import ServiceProcess

QUESTION = [{"role": "user", "content": "Say something."}]
TOKENS = 8


def test_responses_run_the_users_adapter_like_chat(
        gateway: ServiceProcess, registry: Registry, base: Base) -> None:
    key = registry.create_tenant("responses")
    adapter = make_lora_adapter(base.model, base.root / "responses-lora", seed=41,
                                spec=LoraSpec(rank=8, mode=AdapterMode.ALL))
    registry.upload(key, "resp-bot", adapter, "all")
    registry.bind(key, "rita", "resp-bot")
    client = OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0,
                    http_client=httpx.Client(timeout=120))
    for who in ({"user": "rita"}, {}):
        raw = client.responses.with_raw_response.create(
            model=BASE_NAME, input=QUESTION, max_output_tokens=TOKENS, temperature=0, **who)
        reply = raw.parse()
        chat = client.chat.completions.create(
            model=BASE_NAME, messages=QUESTION, max_tokens=TOKENS, temperature=0,  # type: ignore[arg-type]
            **who)
        assert reply.output_text == chat.choices[0].message.content
        name = "resp-bot" if who else BASE_NAME
        assert reply.model == chat.model == name
        assert raw.headers["x-preft-adapter"] == ("resp-bot" if who else "none")
        assert reply.usage is not None and reply.usage.output_tokens > 0
    with client.responses.stream(model=BASE_NAME, input=QUESTION, user="rita",
                                 max_output_tokens=TOKENS, temperature=0) as stream:
        streamed = stream.get_final_response()
    assert streamed.model == "resp-bot"
