"""Process-wide clients and services, built once in the app's lifespan."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import redis

from preft_serve.common.objectstore import ObjectStore
from preft_serve.common.registry_client import RegistryKeys
from preft_serve.common.registry_client.sync import connect_redis
from preft_serve.registry.adapters import AdapterService
from preft_serve.registry.bindings import BindingService
from preft_serve.registry.metrics import RegistryMetrics
from preft_serve.registry.quotas import Quota
from preft_serve.registry.settings import RegistrySettings
from preft_serve.registry.tenants import TenantService
from preft_serve.registry.usage import UsageService
from preft_serve.registry.validation import BaseModelSpec, UploadBounds

if TYPE_CHECKING:
    from preft_serve.registry.finetune.wiring import FinetuneParts


@dataclasses.dataclass
class RegistryState:
    settings: RegistrySettings
    redis: redis.Redis
    store: ObjectStore
    base: BaseModelSpec
    tenants: TenantService
    adapters: AdapterService
    bindings: BindingService
    usage: UsageService
    finetune: FinetuneParts | None  # /v1/files, /v1/fine_tuning; None: turned off

    @classmethod
    def build(
        cls, settings: RegistrySettings, metrics: RegistryMetrics, store: ObjectStore | None = None
    ) -> RegistryState:
        """Every client and service, whole; the fine-tuning parts are built (not started:
        the app starts them) when ``settings.finetune.enabled``."""
        client = connect_redis(settings.redis_url, health_check_interval=30)
        keys = RegistryKeys(settings.namespace)
        store = store or settings.object_store.create()
        base = BaseModelSpec.load(settings.base_model_label, settings.base_model_config)
        bounds = UploadBounds(
            max_lora_rank=settings.max_lora_rank,
            max_reft_rank=settings.max_reft_rank,
            allowed_dtypes=tuple(settings.allowed_dtypes),
            max_weights_bytes=settings.max_weights_bytes,
            max_config_bytes=settings.max_config_bytes,
            max_archive_members=settings.max_archive_members,
            max_compression_ratio=settings.max_compression_ratio,
        )
        maxlen = settings.events_maxlen
        adapters = AdapterService(
            client,
            keys,
            store,
            base,
            bounds,
            settings.staging_dir,
            maxlen,
            Quota(settings.tenant_max_adapters, settings.tenant_max_stored_bytes),
            settings.max_versions_per_adapter,
        )
        finetune = None
        if settings.finetune.enabled:  # imported only then: the trainer's modules are many
            from preft_serve.registry.finetune.wiring import build_finetune

            finetune = build_finetune(settings, client, store, adapters, metrics)
        return cls(
            settings=settings,
            redis=client,
            store=store,
            base=base,
            tenants=TenantService(client, keys, maxlen, store),
            adapters=adapters,
            bindings=BindingService(client, keys, maxlen, settings.tenant_max_users),
            usage=UsageService(client, keys),
            finetune=finetune,
        )

    def close(self) -> None:
        self.redis.close()
