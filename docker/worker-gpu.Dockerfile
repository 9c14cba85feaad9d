# preft-serve GPU worker: the official vLLM image of the pinned version plus the preft plugin
# (registered through the vllm.general_plugins entry point of the installed package).
# Build from the repository root:
#   docker build -f docker/worker-gpu.Dockerfile -t ghcr.io/preft-serve/worker-gpu:0.1.0 .
FROM vllm/vllm-openai:v0.32.0

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /tmp/preft-serve
COPY pyproject.toml README.md ./
COPY services ./services
COPY kernels ./kernels
# vllm==0.32.0 (the gpu extra) is already in the image, so pip adds only our own package and
# its small dependencies. The image's Python is 3.12 while pyproject.toml still declares
# <3.12 (the CPU development venv), hence --ignore-requires-python. The disagg extra is
# NIXL's CUDA build (nixl-cu12) for the prefill/decode pools; vLLM imports it as `nixl`, a
# meta package installed without its dependencies so it adds no second CUDA stack.
RUN python3 -m pip install --ignore-requires-python ".[gpu,disagg]" \
    && python3 -m pip install --no-deps "nixl==1.5.1" \
    && python3 -c "import preft_serve.worker.plugin, vllm, nixl._api; assert vllm.__version__.startswith('0.32.0')" \
    && rm -rf /tmp/preft-serve

RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /home/app --create-home app
ENV HOME=/home/app HF_HOME=/home/app/.cache/huggingface HF_HUB_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
WORKDIR /home/app
USER 10001:10001
EXPOSE 8000
# No HEALTHCHECK: loading a model takes minutes; the chart's startup/readiness probes call
# vLLM's /health.
ENTRYPOINT ["python3", "-m", "preft_serve.worker.serve"]
CMD ["--help"]
