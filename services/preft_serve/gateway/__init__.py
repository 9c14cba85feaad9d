"""The preft-serve gateway: the OpenAI-compatible front door for tenants.

It authenticates a tenant API key, picks the adapter a request should run (the ``model``
field or the user's binding, read through the registry client), rewrites ``model`` to the
content address ``sha256:<hex>`` that workers load by, and proxies to a worker chosen by
rendezvous hashing with a bounded-load cap. The selection rules are in ``selection.py``,
routing in ``routing.py``, metrics (and their label budget) in ``metrics.py`` and
docs/metrics.md.
"""
