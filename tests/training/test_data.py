"""Training data: every bad input is refused with a message naming the line and the fix;
good input becomes one example per trained assistant turn, prompts rendered as served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from preft_serve.training import data
from preft_serve.training.data import (
    MAX_JSON_DEPTH,
    MAX_LINE_BYTES,
    MAX_REPORTED,
    DataError,
    Overlong,
    TooManyExamples,
    check_conversations,
    load_dataset,
)

GOOD = {
    "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]
}


def write(tmp_path: Path, *lines: Any) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_bytes(
        b"".join(
            (
                line
                if isinstance(line, bytes)
                else (line if isinstance(line, str) else json.dumps(line)).encode()
            )
            + b"\n"
            for line in lines
        )
    )
    return path


def refused(tmp_path: Path, tokenizer: Any, *lines: Any, **kwargs: Any) -> str:
    with pytest.raises(DataError) as info:
        load_dataset(write(tmp_path, *lines), tokenizer, kwargs.pop("max_seq_len", 512), **kwargs)
    return str(info.value)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ({"prompt": "x", "completion": "y"}, 'line 2: expected an object {"messages": [...]}'),
        ({"messages": []}, 'line 2: "messages" must be a non-empty list'),
        ({"messages": [{"role": "user", "content": "Hi"}]}, "line 2: no assistant message"),
        (
            {"messages": [{"role": "robot", "content": "Hi"}, GOOD["messages"][1]]},
            "line 2: message 0 has unknown role 'robot'; supported roles: system, user, assistant",
        ),
        (
            {"messages": [{"role": "user", "content": 5}, GOOD["messages"][1]]},
            "line 2: message 0 (user) needs 'content'",
        ),
        (
            {"messages": [GOOD["messages"][0], {**GOOD["messages"][1], "weight": 0}]},
            "line 2: no assistant message to train on",
        ),
        (
            {"messages": [GOOD["messages"][0], {**GOOD["messages"][1], "weight": 0.5}]},
            "line 2: message 1 has weight 0.5; use 0 or 1",
        ),
        (
            {
                "messages": [
                    GOOD["messages"][0],
                    {"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]},
                ]
            },
            "line 2: message 1 has tool calls",
        ),
        ('{"messages": NaN}', "line 2: not valid JSON (NaN is not allowed"),
        (
            "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),
            f"line 2: JSON nested deeper than {MAX_JSON_DEPTH} levels",
        ),
        (b"\xff\xfe", "line 2: not UTF-8 text"),
    ],
)
def test_bad_lines_name_the_line_and_the_problem(
    tmp_path: Path, toy_tokenizer: Any, line: Any, message: str
) -> None:
    error = refused(tmp_path, toy_tokenizer, GOOD, line, GOOD)
    assert "1 bad line(s)" in error and message in error, error


def test_every_bad_line_is_reported_at_once_and_long_ones_are_not_echoed(
    tmp_path: Path, toy_tokenizer: Any
) -> None:
    huge = "x" * (MAX_LINE_BYTES + 10)
    role = "r" * 10_000
    error = refused(
        tmp_path, toy_tokenizer, "{", GOOD, huge, {"messages": [{"role": role, "content": "a"}]}
    )
    assert "3 bad line(s)" in error
    assert "line 1: not valid JSON" in error
    assert f"line 3: longer than {MAX_LINE_BYTES} bytes" in error
    assert "line 4: message 0 has unknown role 'rrrr" in error
    assert len(error) < 1000  # neither the long line nor the long role is echoed


def test_empty_file_and_blank_lines(tmp_path: Path, toy_tokenizer: Any) -> None:
    assert "has no examples" in refused(tmp_path, toy_tokenizer, "", "  ")
    missing = tmp_path / "absent.jsonl"
    with pytest.raises(DataError, match=r"cannot read .*absent\.jsonl"):
        load_dataset(missing, toy_tokenizer, 512)


def test_one_example_per_trained_assistant_turn_with_the_served_prompt(
    tmp_path: Path, toy_tokenizer: Any
) -> None:
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "U2"},
        {"role": "assistant", "content": "A2"},
        {"role": "user", "content": [{"type": "text", "text": "U"}, {"type": "text", "text": "3"}]},
        {"role": "assistant", "content": "A3", "weight": 0},
    ]
    data = load_dataset(write(tmp_path, {"messages": messages}), toy_tokenizer, 512)
    assert [(e.line, e.turn) for e in data.examples] == [(1, 2), (1, 4)]
    decode = toy_tokenizer.decode
    # The prompt is exactly what a chat completion renders for the messages before the turn.
    for example, upto in zip(data.examples, (2, 4)):
        served = toy_tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in messages[:upto]],
            tokenize=False,
            add_generation_prompt=True,
        )
        assert decode(list(example.prompt)) == served
    assert decode(list(data.examples[0].response)) == "A1\n"
    assert decode(list(data.examples[1].response)) == "A2\n"
    assert decode(list(data.examples[1].prompt)).endswith("<|user|>U2\n<|assistant|>")


@pytest.mark.parametrize("policy", list(Overlong))
def test_overlong_examples_follow_the_chosen_policy(
    tmp_path: Path, toy_tokenizer: Any, policy: Overlong
) -> None:
    long = {
        "messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "y" * 100}]
    }
    prompt_too_long = {
        "messages": [{"role": "user", "content": "q" * 200}, {"role": "assistant", "content": "z"}]
    }
    path = write(tmp_path, GOOD, long, prompt_too_long)
    if policy is Overlong.ERROR:
        with pytest.raises(DataError) as info:
            load_dataset(path, toy_tokenizer, 64, policy)
        assert "2 example(s) longer than --max-seq-len 64" in str(info.value)
        assert "line 2 (turn 1)" in str(info.value) and "line 3 (turn 1)" in str(info.value)
        return
    data = load_dataset(path, toy_tokenizer, 64, policy)
    assert all(len(e) <= 64 for e in data.examples)
    if policy is Overlong.TRUNCATE:
        assert (data.truncated, data.dropped, len(data.examples)) == (1, 1, 2)
        assert "1 truncated, 1 dropped as too long" in data.summary()
    else:
        assert (data.truncated, data.dropped, len(data.examples)) == (0, 2, 1)


def test_smollm2_style_templates_end_the_response_at_the_end_of_turn_token(
    tmp_path: Path, toy_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newline a template writes after the end-of-turn token is never generated."""
    monkeypatch.setattr(
        toy_tokenizer,
        "chat_template",
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
        "<|eos|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>"
        "{% endif %}",
    )
    data = load_dataset(write(tmp_path, GOOD), toy_tokenizer, 512)
    assert toy_tokenizer.decode(list(data.examples[0].response)) == "Hello there<|eos|>"


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = data.parse_conversation

    def counting(raw: str) -> list[dict[str, Any]]:
        calls[0] += 1
        return real(raw)

    monkeypatch.setattr(data, "parse_conversation", counting)
    return calls


def test_a_file_of_bad_lines_stops_parsing_after_the_reported_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's file of millions of bad lines costs the same as one of ten: the pass
    stops parsing at the last line it reports and only counts the rest."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"x\n" * 200_000)
    calls = _count_parses(monkeypatch)
    with pytest.raises(DataError) as info:
        check_conversations(path)
    message = str(info.value)
    assert calls[0] == MAX_REPORTED
    assert f"stopped after {MAX_REPORTED} bad lines; {200_000 - MAX_REPORTED} later" in message
    assert message.count("not valid JSON") == MAX_REPORTED and len(message) < 2000


def test_the_example_cap_stops_the_pass_at_the_first_example_past_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, *[GOOD] * 1000)
    calls = _count_parses(monkeypatch)
    with pytest.raises(TooManyExamples, match="more than 5 examples"):
        check_conversations(path, max_examples=5)
    assert calls[0] == 6
    checked = check_conversations(path, max_examples=1000)
    assert checked.conversations == 1000
    assert checked.longest_line_bytes == len(json.dumps(GOOD)) + 1  # with its newline


def test_a_lone_surrogate_is_refused_before_training(tmp_path: Path, toy_tokenizer: Any) -> None:
    line = (
        '{"messages": [{"role": "user", "content": "hi \\udc00"}, '
        '{"role": "assistant", "content": "x"}]}'
    )
    error = refused(tmp_path, toy_tokenizer, GOOD, line)
    assert "line 2: message 0 (user) has a lone surrogate" in error, error
