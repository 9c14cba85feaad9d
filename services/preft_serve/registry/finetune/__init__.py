"""OpenAI-compatible fine-tuning: tenants upload JSONL files and run ``preft train`` as jobs.

``files`` (upload, validation, content-addressed storage), ``jobs`` (the job records and
their events in Redis), ``service`` (what the REST API does), ``dispatcher`` (starts queued
jobs, follows running ones, registers the result like an upload) and ``runners`` (where a
job's trainer runs: a local process pool or Kubernetes Jobs). ``entry`` is the trainer
process itself, the same in both backends.
"""
