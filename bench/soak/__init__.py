"""Soak with chaos (``make soak``): the whole stack under traffic and tenant changes while
its parts are killed and paused, then checks that nothing was lost or wrong.

:mod:`~bench.soak.processes` runs the stack, :mod:`~bench.soak.traffic` and
:mod:`~bench.soak.churn` drive it, :mod:`~bench.soak.chaos` breaks it,
:mod:`~bench.soak.verify` and :mod:`~bench.soak.state` judge it, and
:mod:`~bench.soak.run` ties them together (its docstring is the ``--help``).
"""

from bench.soak.run import main

__all__ = ["main"]
