"""Soak with chaos (``make soak``): the whole stack under traffic and tenant changes while
its parts are killed and paused, then checks that nothing was lost or wrong.

:mod:`~loadtests.soak.processes` runs the stack, :mod:`~loadtests.soak.traffic` and
:mod:`~loadtests.soak.churn` drive it, :mod:`~loadtests.soak.chaos` breaks it,
:mod:`~loadtests.soak.verify` and :mod:`~loadtests.soak.state` judge it, and
:mod:`~loadtests.soak.run` ties them together (its docstring is the ``--help``).
"""

from loadtests.soak.run import main

__all__ = ["main"]
