"""Adapter registry service: tenants, API keys, adapter upload/validation/versioning,
user bindings and change events. Run it with ``python -m preft_serve.registry``.

Source of truth is Redis (metadata, bindings, events; layout in
``preft_serve.common.registry_client.RegistryKeys``) plus the object store (content-addressed
blobs). See docs/registry.md.
"""
