"""Where the workers are: a static list, a headless Service's DNS, or its EndpointSlices.

Each source answers "which worker base URLs exist now"; ``gateway.pool_monitor`` polls it and
hands the answer to the ``WorkerPool``. A failed lookup keeps the previous list (a DNS or
API-server hiccup must not empty the pool), while a successful empty answer empties it
(the workers really are gone, e.g. scaled to zero).

Backends are chosen by name (``PREFT_GATEWAY_DISCOVERY``, a :class:`DiscoveryKind`); a new
one is a :class:`WorkerSource` class plus one :func:`register_discovery` line here.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from preft_serve.gateway.settings import DiscoveryKind, GatewaySettings

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class WorkerSource(Protocol):
    async def urls(self) -> list[str]: ...

    def describe(self) -> str: ...


def worker_url(scheme: str, address: str, port: int) -> str:
    """``scheme://address:port`` with IPv6 addresses bracketed."""
    try:
        if ipaddress.ip_address(address).version == 6:
            address = f"[{address}]"
    except ValueError:
        pass  # a host name
    return f"{scheme}://{address}:{port}"


class StaticSource:
    def __init__(self, urls: Iterable[str]) -> None:
        self._urls = list(urls)

    async def urls(self) -> list[str]:
        return list(self._urls)

    def describe(self) -> str:
        return f"static list of {len(self._urls)}"


class DnsSource:
    """Every address the name resolves to (a headless Service has one A record per ready
    pod), sorted so the list is stable between lookups."""

    def __init__(self, name: str, port: int, scheme: str = "http") -> None:
        self.name, self.port, self.scheme = name, port, scheme

    async def urls(self) -> list[str]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.name, self.port, type=socket.SOCK_STREAM)
        addresses = sorted({str(info[4][0]) for info in infos})
        return [worker_url(self.scheme, a, self.port) for a in addresses]

    def describe(self) -> str:
        return f"DNS {self.name}:{self.port}"


def endpoint_slice_urls(slices: Iterable[Any], default_port: int, scheme: str) -> list[str]:
    """Ready, non-terminating endpoints of ``discovery.k8s.io/v1`` EndpointSlice objects.

    A ``ready`` condition that is unset counts as ready (the API's documented meaning); the
    port is the slice's port named ``http``, else ``default_port``.
    """
    urls: set[str] = set()
    for item in slices:
        ports = {p.name: p.port for p in (item.ports or []) if p.port}
        port = ports.get("http") or default_port
        for endpoint in item.endpoints or []:
            conditions = endpoint.conditions
            if conditions is not None and (conditions.ready is False or conditions.terminating):
                continue
            for address in (endpoint.addresses or [])[:1]:
                urls.add(worker_url(scheme, address, port))
    return sorted(urls)


class KubernetesSource:
    """The EndpointSlices of the workers' Service, read through the ``kubernetes`` client
    (in-cluster service account; needs get/list on ``discovery.k8s.io`` endpointslices)."""

    def __init__(
        self, service: str, namespace: str, port: int, scheme: str = "http", api_client: Any = None
    ) -> None:
        from kubernetes import client, config

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self.api = client.DiscoveryV1Api(api_client)
        self.service, self.namespace, self.port, self.scheme = service, namespace, port, scheme

    async def urls(self) -> list[str]:
        result = await asyncio.to_thread(
            self.api.list_namespaced_endpoint_slice,
            self.namespace,
            label_selector=f"{SERVICE_NAME_LABEL}={self.service}",
            _request_timeout=10,
        )
        return endpoint_slice_urls(result.items, self.port, self.scheme)

    def describe(self) -> str:
        return f"EndpointSlices of service {self.namespace}/{self.service}"


def own_namespace() -> str:
    """This pod's namespace, from its service-account mount ('default' outside a cluster)."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


_Factory = Callable[[GatewaySettings], WorkerSource]
_BACKENDS: dict[DiscoveryKind, _Factory] = {}


def register_discovery(kind: DiscoveryKind, factory: _Factory) -> None:
    """Make ``kind`` selectable; ``factory(settings)`` builds its source."""
    _BACKENDS[kind] = factory


def create_source(settings: GatewaySettings) -> WorkerSource:
    """The source ``settings.discovery`` names; an unknown one lists the valid names."""
    factory = _BACKENDS.get(settings.discovery)
    if factory is None:
        valid = ", ".join(k.value for k in _BACKENDS)
        raise ValueError(f"unknown worker discovery {settings.discovery!r}; valid: {valid}")
    return factory(settings)


def create_decode_source(settings: GatewaySettings) -> WorkerSource | None:
    """The decode pool's source, of the same discovery kind (None: no decode pool)."""
    if not settings.has_decode_pool:
        return None
    return create_source(
        settings.model_copy(
            update={
                "worker_urls": settings.decode_worker_urls,
                "worker_dns_name": settings.decode_worker_dns_name,
                "worker_service": settings.decode_worker_service,
            }
        )
    )


def _static(settings: GatewaySettings) -> WorkerSource:
    return StaticSource(settings.worker_urls)


def _dns(settings: GatewaySettings) -> WorkerSource:
    assert settings.worker_dns_name
    return DnsSource(settings.worker_dns_name, settings.worker_port, settings.worker_scheme)


def _kubernetes(settings: GatewaySettings) -> WorkerSource:
    assert settings.worker_service
    return KubernetesSource(
        settings.worker_service,
        settings.worker_k8s_namespace or own_namespace(),
        settings.worker_port,
        settings.worker_scheme,
    )


register_discovery(DiscoveryKind.STATIC, _static)
register_discovery(DiscoveryKind.DNS, _dns)
register_discovery(DiscoveryKind.KUBERNETES, _kubernetes)
