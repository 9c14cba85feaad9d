"""Cluster-scale simulation of preft-serve (``python -m bench.scale_sim``; docs/scale.md).

Modules, one job each: ``model`` (service-time profiles, worker and gateway settings),
``workload`` (tenants, users, conversations), ``tiers`` (a worker's adapter tiers),
``worker`` (the engine's step model), ``gateway`` (the product's WorkerPool and
ResolveCache per gateway), ``cluster`` (the event loop and pod lifecycle), ``prewarm``,
``scenarios``, ``metrics``, ``validate`` (against recorded load tests), ``stalls`` (a recorded
run's measured pauses and fetch time), ``report``, ``misses`` (what a steady run's store
fetches are: instrumentation of one run).
"""
