"""How an adapter reaches a slot: object store -> disk -> host memory -> slot.

``resolver`` (vLLM's LoRA resolver: a ``sha256:<hex>`` name to a directory on disk),
``disk_cache`` (the size-bounded disk LRU it fills), ``hot_swap_prefetch`` (registry events
download a new version before its first request), ``background_parse`` (weights parsed into
host memory off the engine loop) and ``parse_gate`` (the scheduler holds a request back
until its adapter is parsed). The last step, host memory to slot, is vLLM's LoRA manager.
"""
