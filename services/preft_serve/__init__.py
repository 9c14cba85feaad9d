"""preft-serve: multi-tenant serving of prefill-only (PreFT) adapters on vLLM.

Subpackages: ``common`` (adapter format, logging, object stores), ``registry``,
``gateway``, ``worker`` (the vLLM plugin) and ``toymodels`` (deterministic tiny models).
"""

__version__ = "0.1.0"
