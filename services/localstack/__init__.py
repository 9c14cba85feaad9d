"""The whole service on one machine (``make run``): Redis, registry, a CPU worker, gateway.

``python -m preft_serve.localstack`` starts each part as its own process, seeds a demo
tenant, and stops everything on Ctrl-C. The load tests reuse :class:`LocalStack` and the
registry helpers in :mod:`preft_serve.localstack.seed`.
"""

from preft_serve.localstack.processes import Child, StackError, free_port
from preft_serve.localstack.stack import LocalStack, StackConfig

__all__ = ["Child", "LocalStack", "StackConfig", "StackError", "free_port"]
