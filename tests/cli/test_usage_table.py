"""``preft usage --by version``'s table, from an answer built with the API's own wire
model: per version its counts, errors and mean time to first token, and the totals."""

from __future__ import annotations

import io

from preft_serve.cli.output import render
from preft_serve.common.usage_wire import UsageReport

VERSIONS = [
    # name, requests, prompt, completion, errors, streams, ttft seconds summed
    ("bot@2", 7, 70, 140, 1, 3, 0.6),
    ("bot@3", 3, 30, 60, 2, 0, 0.0),
]


def answer() -> dict[str, object]:
    items = [
        {
            "name": name,
            "requests": requests,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "errors": errors,
            "ttft_count": streams or None,
            "ttft_seconds_sum": ttft or None,
            "ttft_seconds_mean": ttft / streams if streams else None,
        }
        for name, requests, prompt, completion, errors, streams, ttft in VERSIONS
    ]
    report = UsageReport.model_validate(
        {
            "tenant": "acme",
            "group_by": "day",
            "by": "version",
            "since": "2026-12-01T00:00:00Z",
            "until": "2026-12-08T00:00:00Z",
            "buckets": [{"start": "2026-12-07T00:00:00Z", "items": items}],
            "bounds": {"named_per_bucket": 100, "hourly_days": 7, "max_days": 92, "max_hours": 168},
        }
    )
    return report.model_dump(mode="json", exclude_none=True)


def test_each_version_shows_its_errors_and_mean_time_to_first_token() -> None:
    out = io.StringIO()
    render(answer(), "usage show", out)
    header, *rows = [line.split() for line in out.getvalue().splitlines()[:-1]]
    assert header == [
        "DAY", "VERSION", "REQUESTS", "PROMPT_TOKENS", "COMPLETION_TOKENS", "ERRORS",
        "TTFT_MS_MEAN",
    ]  # fmt: skip
    assert rows[0] == ["2026-12-07", "bot@2", "7", "70", "140", "1", f"{600 / 3:.1f}"]
    assert rows[1] == ["2026-12-07", "bot@3", "3", "30", "60", "2", "-"]  # no stream
    requests = sum(v[1] for v in VERSIONS)
    errors = sum(v[4] for v in VERSIONS)
    streams = sum(v[5] for v in VERSIONS)
    mean_ms = sum(v[6] for v in VERSIONS) / streams * 1000
    assert rows[2] == ["total", str(requests), "100", "200", str(errors), f"{mean_ms:.1f}"]
