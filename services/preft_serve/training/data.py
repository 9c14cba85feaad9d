"""Chat fine-tuning data: the OpenAI JSONL format, checked line by line, then tokenized the
way the worker will see it.

One line is one conversation: ``{"messages": [{"role": ..., "content": ...}, ...]}`` with
roles ``system``, ``user`` and ``assistant`` (OpenAI's optional ``"weight": 0`` on an
assistant message skips it). Every trained assistant turn becomes one :class:`Example`:
the prompt is the chat template applied to every message before the turn with the
generation prompt (exactly what a chat completion request renders), the response is the
rest of the rendered conversation up to and including the end-of-turn token. Tenants
control these files, so every size is bounded before anything is parsed or echoed.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from preft_serve.common.jsondepth import json_nests_deeper

ROLES = ("system", "user", "assistant")
MAX_LINE_BYTES = 1 << 20
MAX_MESSAGES = 256
MAX_JSON_DEPTH = 16
MAX_REPORTED = 10  # problems listed in one error
_QUOTE_CHARS = 60


class DataError(ValueError):
    """The training data cannot be used; the message names the file and line(s)."""


class TooManyExamples(DataError):
    """The file holds more conversations than the caller allows."""


class NothingFits(DataError):
    """No example of the file fits ``max_seq_len``; ``needed`` is the smallest value that
    would keep one, so callers can say what to change in their own terms."""

    def __init__(self, path: Path, max_seq_len: int, needed: int) -> None:
        self.path, self.max_seq_len, self.needed = path, max_seq_len, needed
        super().__init__(
            f"{path}: every example is longer than --max-seq-len {max_seq_len} "
            f"tokens (keeping the shortest needs {needed}); shorten the "
            f"examples, or pass --max-seq-len {needed} or more"
        )


class Overlong(str, enum.Enum):
    """What to do with an example longer than ``max_seq_len`` tokens."""

    TRUNCATE = "truncate"  # keep the first max_seq_len tokens (the response's tail goes)
    DROP = "drop"  # leave the example out
    ERROR = "error"  # refuse the file, naming the lines


@dataclasses.dataclass(frozen=True)
class Example:
    """One trained assistant turn: prompt tokens, then the response tokens the loss covers."""

    prompt: tuple[int, ...]
    response: tuple[int, ...]
    line: int  # 1-based line in the source file
    turn: int  # index of the assistant message in the conversation

    @property
    def ids(self) -> list[int]:
        return [*self.prompt, *self.response]

    def __len__(self) -> int:
        return len(self.prompt) + len(self.response)


@dataclasses.dataclass
class Dataset:
    """Tokenized examples plus what happened to the ones that did not fit."""

    examples: list[Example]
    conversations: int
    truncated: int = 0
    dropped: int = 0

    @property
    def response_tokens(self) -> int:
        return sum(len(e.response) for e in self.examples)

    def summary(self) -> str:
        extra = []
        if self.truncated:
            extra.append(f"{self.truncated} truncated")
        if self.dropped:
            extra.append(f"{self.dropped} dropped as too long")
        tail = f" ({', '.join(extra)})" if extra else ""
        return (
            f"{len(self.examples)} examples from {self.conversations} conversations, "
            f"{self.response_tokens} response tokens{tail}"
        )


def _quote(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[:_QUOTE_CHARS] + "..."


def _content_text(content: object) -> str | None:
    """A message's text: a string, or OpenAI's list of ``{"type": "text", "text": ...}``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    return None


def _is_unicode(text: str) -> bool:
    """JSON lets ``\\ud800`` through as a lone surrogate, which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_conversation(raw: str) -> list[dict[str, Any]]:
    """One JSONL line -> messages ``[{"role", "content", "weight"}]``; raises ValueError
    with a message that says what to fix (without the line number)."""
    if json_nests_deeper(raw, MAX_JSON_DEPTH):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        record = json.loads(
            raw, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not allowed"))
        )
    except (json.JSONDecodeError, ValueError) as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(record, dict) or "messages" not in record:
        raise ValueError('expected an object {"messages": [...]}')
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError('"messages" must be a non-empty list')
    if len(messages) > MAX_MESSAGES:
        raise ValueError(f"{len(messages)} messages; at most {MAX_MESSAGES} per conversation")
    parsed: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"message {i} is not an object")  # noqa: TRY004 (a bad line)
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(
                f"message {i} has unknown role {_quote(role)}; supported roles: {', '.join(ROLES)}"
            )
        if message.get("tool_calls") or message.get("function_call"):
            raise ValueError(f"message {i} has tool calls, which training does not support")
        text = _content_text(message.get("content"))
        if text is None:
            raise ValueError(
                f"message {i} ({role}) needs 'content': a string or a list of "
                '{"type": "text", "text": ...} parts'
            )
        if not _is_unicode(text):
            raise ValueError(
                f"message {i} ({role}) has a lone surrogate escape such as "
                "\\ud800 in its content: not valid Unicode text"
            )
        weight = message.get("weight", 1)
        if role == "assistant" and weight not in (0, 1):
            raise ValueError(f"message {i} has weight {_quote(weight)}; use 0 or 1")
        parsed.append({"role": role, "content": text, "weight": weight})
    if not any(m["role"] == "assistant" and m["weight"] == 1 for m in parsed):
        raise ValueError(
            "no assistant message to train on (each example needs at least one "
            '{"role": "assistant", ...} message without "weight": 0)'
        )
    return parsed


def _lines(handle: IO[bytes]) -> Iterator[tuple[int, str | None, str | None]]:
    """(line number, text, problem) for every line, read in bounded pieces: a line longer
    than :data:`MAX_LINE_BYTES` is skipped piecewise, never held whole."""
    number = 0
    while chunk := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(chunk) > MAX_LINE_BYTES and not chunk.endswith(b"\n"):
            while chunk and not chunk.endswith(b"\n"):  # skip the rest of it
                chunk = handle.readline(MAX_LINE_BYTES)
            yield number, None, f"longer than {MAX_LINE_BYTES} bytes"
            continue
        try:
            yield number, chunk.decode("utf-8"), None
        except UnicodeDecodeError:
            yield number, None, "not UTF-8 text"


def _open(path: Path) -> IO[bytes]:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None


def _unchecked_lines(handle: IO[bytes]) -> int:
    """Lines left in ``handle``, counted in fixed-size reads without parsing them."""
    count, last = 0, b"\n"
    while block := handle.read(1 << 20):
        count += block.count(b"\n")
        last = block[-1:]
    return count + (last != b"\n")


@dataclasses.dataclass(frozen=True)
class FileCheck:
    """What one checking pass learned of a file: enough to bound a job on it.

    ``shortest_prompt_bytes``: the fewest bytes of message text (each message stripped, as
    chat templates may) before any trained assistant turn. Every token stands for a bounded
    number of bytes, so this bounds the shortest prompt's tokens from below: a file whose
    every prompt alone fills ``max_seq_len`` can be refused before a trainer starts.
    """

    conversations: int
    longest_line_bytes: int
    shortest_prompt_bytes: int


def shortest_prompt_bytes(messages: Sequence[dict[str, Any]]) -> int:
    """The fewest text bytes before one of the conversation's trained assistant turns."""
    before = 0
    for message in messages:
        if message["role"] == "assistant" and message["weight"] == 1:
            return before
        before += len(message["content"].strip().encode("utf-8"))
    return before  # parse_conversation guarantees a trained turn; not reached


def check_conversations(path: Path, max_examples: int | None = None) -> FileCheck:
    """Conversations in a JSONL file (and its longest line), checked in one streaming pass.

    Memory stays bounded whatever the file holds (tenants upload these): the pass keeps
    counts and at most :data:`MAX_REPORTED` messages, stops parsing after that many bad
    lines (the rest are counted, not parsed) and as soon as the file has more than
    ``max_examples`` conversations. Raises :class:`DataError` naming what to fix.
    """
    problems: list[str] = []
    conversations = longest = 0
    shortest: int | None = None
    with _open(path) as handle:
        for number, raw, unreadable in _lines(handle):
            problem = unreadable
            if problem is None and raw is not None and raw.strip():
                try:
                    messages = parse_conversation(raw)
                    conversations += 1
                    longest = max(longest, len(raw.encode("utf-8")))
                    prompt = shortest_prompt_bytes(messages)
                    shortest = prompt if shortest is None else min(shortest, prompt)
                except ValueError as exc:
                    problem = str(exc)
            if problem is not None:
                problems.append(f"line {number}: {problem}")
                if len(problems) == MAX_REPORTED:
                    rest = _unchecked_lines(handle)
                    more = (
                        (
                            f"\n  (stopped after {MAX_REPORTED} bad lines; {rest} later "
                            "line(s) not checked)"
                        )
                        if rest
                        else ""
                    )
                    raise DataError(
                        f"{path}: {MAX_REPORTED} bad line(s):\n  " + "\n  ".join(problems) + more
                    )
            if max_examples is not None and conversations > max_examples:
                raise TooManyExamples(
                    f"{path} has more than {max_examples} examples (stopped at "
                    f"line {number}); at most {max_examples} per file"
                )
    if problems:
        raise DataError(f"{path}: {len(problems)} bad line(s):\n  " + "\n  ".join(problems))
    if not conversations:
        raise DataError(
            f"{path} has no examples (one JSON object per line: "
            '{"messages": [{"role": "user", ...}, {"role": "assistant", ...}]})'
        )
    return FileCheck(conversations, longest, shortest or 0)


def read_conversations(path: Path) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """(line number, messages) for every non-blank line, after :func:`check_conversations`
    accepted the whole file (so nothing is trained on a file with a bad line)."""
    check_conversations(path)
    with _open(path) as handle:
        for number, raw, _ in _lines(handle):
            if raw is not None and raw.strip():
                yield number, parse_conversation(raw)


def _end_of_turn(response: str, eos_token: str | None) -> str:
    """The response text up to and including the end-of-turn token (the trailing newline
    some templates add after it is never generated, so it is not trained)."""
    if eos_token and eos_token in response:
        return response[: response.index(eos_token) + len(eos_token)]
    return response


def tokenize_conversation(
    tokenizer: Any, messages: Sequence[dict[str, Any]], line: int
) -> list[Example]:
    """One :class:`Example` per trained assistant turn of a conversation."""
    examples = []
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    for turn, message in enumerate(messages):
        if message["role"] != "assistant" or message["weight"] != 1:
            continue
        prompt_text = tokenizer.apply_chat_template(
            plain[:turn], tokenize=False, add_generation_prompt=True
        )
        full_text = tokenizer.apply_chat_template(plain[: turn + 1], tokenize=False)
        if not full_text.startswith(prompt_text):
            raise DataError(
                f"line {line}: the model's chat template does not render the "
                f"prompt as a prefix of the conversation at message {turn}"
            )
        response_text = _end_of_turn(full_text[len(prompt_text) :], tokenizer.eos_token)
        prompt = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        response = tokenizer(response_text, add_special_tokens=False)["input_ids"]
        if not prompt or not response:
            raise DataError(
                f"line {line}: message {turn} renders to an empty "
                f"{'prompt' if not prompt else 'response'}"
            )
        examples.append(Example(tuple(prompt), tuple(response), line, turn))
    return examples


def load_dataset(
    path: Path, tokenizer: Any, max_seq_len: int, overlong: Overlong = Overlong.TRUNCATE
) -> Dataset:
    """Read, check and tokenize a JSONL file; apply the ``overlong`` policy."""
    examples: list[Example] = []
    conversations = truncated = dropped = 0
    needed: int | None = None  # the smallest max_seq_len that keeps a dropped example
    too_long: list[str] = []
    for line, messages in read_conversations(path):
        conversations += 1
        for example in tokenize_conversation(tokenizer, messages, line):
            if len(example) <= max_seq_len:
                examples.append(example)
            elif overlong is Overlong.ERROR:
                too_long.append(f"line {line} (turn {example.turn}): {len(example)} tokens")
            elif overlong is Overlong.TRUNCATE and len(example.prompt) < max_seq_len:
                keep = max_seq_len - len(example.prompt)
                examples.append(dataclasses.replace(example, response=example.response[:keep]))
                truncated += 1
            else:  # DROP, or a prompt that alone fills the budget
                dropped += 1
                keeps = len(example) if overlong is Overlong.DROP else len(example.prompt) + 1
                needed = keeps if needed is None else min(needed, keeps)
    if too_long:
        shown = "\n  ".join(too_long[:MAX_REPORTED])
        raise DataError(
            f"{path}: {len(too_long)} example(s) longer than --max-seq-len "
            f"{max_seq_len}:\n  {shown}\nraise --max-seq-len, or pass "
            "--overlong truncate|drop"
        )
    if not examples:
        raise NothingFits(path, max_seq_len, needed or max_seq_len + 1)
    return Dataset(examples, conversations, truncated, dropped)
