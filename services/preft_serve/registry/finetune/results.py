"""A job's result file in OpenAI's shape: one CSV row per optimizer step.

The columns are OpenAI's; the trainer records the training loss of every step and the
validation loss where it evaluated, and no token accuracy, so those cells stay empty
rather than invented. Nothing of the trainer's configuration (its paths on the server)
is in it.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

COLUMNS = ("step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy")


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return ""
    return repr(float(value))


def step_metrics_csv(metrics: dict[str, Any]) -> bytes:
    """``training_metrics.json`` (``train_loss``/``eval_loss``: lists of ``{step, loss}``)
    as the CSV, rows in step order."""
    rows: dict[int, dict[str, str]] = {}
    for column, series in (("train_loss", "train_loss"), ("valid_loss", "eval_loss")):
        for point in metrics.get(series) or ():
            if isinstance(point, dict) and isinstance(point.get("step"), int):
                rows.setdefault(point["step"], {})[column] = _number(point.get("loss"))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for step in sorted(rows):
        writer.writerow([step, *(rows[step].get(c, "") for c in COLUMNS[1:])])
    return out.getvalue().encode()
