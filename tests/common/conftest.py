"""A fresh registry namespace per test on the session's Redis, and the registry's writer."""

from __future__ import annotations

import uuid

import pytest

from tests.support.registry_writer import Writer


@pytest.fixture
def namespace() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


@pytest.fixture
def writer(redis_server: str, namespace: str) -> Writer:
    return Writer(redis_server, namespace)
