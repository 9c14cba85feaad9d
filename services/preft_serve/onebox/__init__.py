"""The whole service on one machine (``make run``): Redis, registry, a CPU worker, gateway.

``python -m preft_serve.onebox`` starts each part as its own process, seeds a demo
tenant, and stops everything on Ctrl-C. The load tests reuse :class:`OneBox` and the
registry helpers in :mod:`preft_serve.onebox.seed`.
"""

from preft_serve.onebox.processes import Child, StackError, free_port
from preft_serve.onebox.stack import OneBox, StackConfig

__all__ = ["Child", "OneBox", "StackConfig", "StackError", "free_port"]
