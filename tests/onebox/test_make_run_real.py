"""``make run``'s default demo on the real model, as a person would judge it.

One ``python -m preft_serve.onebox --exit-after-demo`` on SmolLM2: it trains PreFT
adapters for alice and bob on their synthetic facts, serves them, and asks a question no
adapter was trained on. Each user's answer must hold their own fact and not the other's;
the base model's none. The facts are the training data's (an independent expectation),
checked on the printed answers themselves, not only on the demo's own verdict lines.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from preft_serve.onebox.personal import DEMO_USERS, QUESTION_KEY
from preft_serve.training.synthetic import PERSONAS
from tests.support.ports import free_port
from tests.support.real_model import real_model_dir

TIMEOUT_S = 1500  # two trainings (~70 s each on an idle 2-core machine) + the worker start
# The suite's default is 900 s per test.
pytestmark = [pytest.mark.timeout(TIMEOUT_S + 60), pytest.mark.real_model]


def facts() -> dict[str, str]:
    return {
        u: next(f.value for f in PERSONAS[u].facts if f.key == QUESTION_KEY) for u in DEMO_USERS
    }


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> str:
    models = real_model_dir().parent
    var = tmp_path_factory.mktemp("real-run")
    argv = [
        sys.executable,
        "-m",
        "preft_serve.onebox",
        "--var",
        str(var),
        "--models-dir",
        str(models),
        "--exit-after-demo",
        *[
            a
            for name in ("redis", "registry", "worker", "gateway")
            for a in (f"--{name}-port", str(free_port()))
        ],
    ]
    # OpenMP waits passively (tests/conftest.py): the suite's other process shares the cores.
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    return done.stdout


def answers(output: str) -> dict[str, str]:
    """who -> the answer the demo printed for them."""
    found = dict(re.findall(r"^  (base model|\w+)\s+\([^)]*\): (.*)$", output, re.MULTILINE))
    assert set(found) == {"base model", *DEMO_USERS}, output
    return found


def test_each_user_gets_their_own_fact_back(output: str) -> None:
    got, want = answers(output), facts()
    for user, fact in want.items():
        assert fact in got[user], (user, got[user])
        others = [f for u, f in want.items() if u != user]
        assert not any(f in got[user] for f in others), (user, got[user])
    assert not any(f in got["base model"] for f in want.values())
    assert output.count("-> right fact") == len(DEMO_USERS)
    assert "-> knows none of them" in output


def test_first_run_trained_both_users_and_said_how_long(output: str) -> None:
    for user in DEMO_USERS:
        assert re.search(rf"{user}: loss \d+\.\d+ -> 0\.0\d+ in \d+ s", output), output
