# nextok: `make run` generates with the default model, `make test` runs the test suite.
# Works from a fresh clone (CI runs `bash .ci/run` = `make test` as root with CI=true).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.nextok-installed

# Exact pins for development and CI; pyproject.toml keeps torch a range for the GPU machine.
PIP_PIN   := pip==26.0
TORCH_PIN := torch==2.13.0
PINS      := tokenizers==0.23.3 gguf==0.19.0 safetensors==0.8.0 numpy==2.4.6 jinja2==3.1.6 \
             tqdm==4.70.1 psutil==7.2.2 pytest==9.2.0 transformers==5.17.0 accelerate==1.15.0 \
             fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 pydantic==2.14.4 \
             prometheus-client==0.26.0 openai==3.57.0 httpx==0.29.0 schemathesis==4.32.5 \
             matplotlib==3.10.8 triton==3.6.0 \
             pygls==2.1.1 lsprotocol==2025.0.0 cattrs==26.2.1

PYTEST_ARGS ?=

.PHONY: venv model system-deps peer run test lint clean

venv: $(STAMP)

# Re-runs only when the dependency lists change; torch first, so the resolver keeps the local
# CPU build instead of pulling a CUDA one.
$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "error: $(PYTHON) is older than 3.11 (set PYTHON=python3.11)" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q $(PIP_PIN)
	$(BIN)/python -m pip install --disable-pip-version-check $(TORCH_PIN)
	$(BIN)/python -m pip install --disable-pip-version-check -e '.[test,server,bench,lsp]' $(TORCH_PIN) $(PINS)
	touch $@

# Pulls the default model into the cache (~/.cache/nextok); a no-op when it is already there.
model: venv
	$(BIN)/python -m nextok.hub pull

# Debian packages the tests use: a real Prometheus server scrapes nextok's /metrics.
system-deps:
	@command -v prometheus >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ]; then \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus \
			|| { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }; \
		else echo "warning: prometheus is not installed (apt-get install prometheus); its test will skip" >&2; fi; }

# llama.cpp's own llama-server, the peer of `nextok bench compare`: built once from the llama.cpp
# source vendored in the llama-cpp-python sdist and cached (~/.cache/nextok/peer; 8-14 min on 2 cores).
peer: venv
	bash benchmarks/peer/build_llama_server.sh $(BIN)/python

# The server on the default model; Ctrl-C (or SIGTERM) drains and stops it.
PORT ?= 8000
run: venv model
	$(BIN)/nextok serve --host 127.0.0.1 --port $(PORT)

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
test: venv model system-deps
	@rc=0; $(BIN)/python -m pytest -q -p no:cacheprovider tests $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest ran no tests" >&2; exit 1; fi; exit $$rc

lint: venv
	$(BIN)/python -m compileall -q nextok tests

clean:
	rm -rf $(VENV) build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
