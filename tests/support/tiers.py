"""What makes a test slow, declared where the expensive thing is started.

A helper in ``tests/support`` that starts a process, or a fixture that starts engines, carries
its tiers (:func:`tier`); ``tests/conftest.py`` puts every test that requests such a fixture,
or whose module imports such a helper, in those tiers and so in ``slow``. A slow test that
uses neither lives in one of the tier folders (``tests/conftest.py``'s ``FOLDER_TIERS``).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
ATTRIBUTE = "__test_tiers__"


def tier(*tiers: str) -> Callable[[T], T]:
    """Mark a helper or fixture function (below ``@pytest.fixture``) as starting ``tiers``."""

    def mark(obj: T) -> T:
        setattr(obj, ATTRIBUTE, tuple(tiers))
        return obj

    return mark


def tiers_of(obj: Any) -> tuple[str, ...]:
    """The tiers ``obj`` was marked with; none for anything else. Only functions and classes
    are asked: any other module global (a lazy proxy, a mock) may answer every attribute."""
    if not issubclass(type(obj), (types.FunctionType, types.MethodType, type)):
        return ()
    found = getattr(obj, ATTRIBUTE, ())
    return found if isinstance(found, tuple) else ()
