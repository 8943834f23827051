# nextok on CPU. Build: docker build -t nextok:cpu .   Run: docker compose -f docker-compose.simple.yml up
# Three stages: `playground` fetches the Monaco assets, `build` installs nextok into a virtual
# environment, `runtime` copies only that environment; the last two on the same pinned base, so
# the venv's interpreter path holds.
# The /playground page's Monaco editor, as `make playground` builds it: the pinned monaco-editor's
# AMD build (min/vs), copied into the package below so the installed nextok serves the page.
FROM node:20-bookworm-slim AS playground
WORKDIR /src/editors/playground
COPY editors/playground/package.json editors/playground/package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error


FROM python:3.11-slim-bookworm AS build

# torch for CPU; point TORCH_INDEX_URL at PyTorch's CPU wheel index to leave the CUDA libraries out
# (empty: the default index). The other pins come from pyproject.toml (the Makefile's PINS).
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/nextok
ENV PATH=/opt/nextok/bin:$PATH
WORKDIR /src
RUN pip install pip==26.0 \
 && if [ -n "$TORCH_INDEX_URL" ]; then export PIP_INDEX_URL="$TORCH_INDEX_URL"; fi \
 && pip install "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md ./
COPY nextok ./nextok
COPY --from=playground /src/editors/playground/node_modules/monaco-editor/min/vs ./nextok/server/static/playground/vs
# nextok itself from the source tree: every dependency is pinned in pyproject.toml, so DL3013's
# "pin the version" has nothing left to pin here.
# hadolint ignore=DL3013
RUN pip install ".[server]" "torch==${TORCH_VERSION}"


FROM python:3.11-slim-bookworm AS runtime

# gcc + libgomp: nextok compiles its small C kernels for the host's CPU (-march=native) at first
# use and caches them next to the model; without a compiler it runs, only slower.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 --user-group nextok \
 && mkdir -p /home/nextok/.cache/nextok \
 && chown -R nextok:nextok /home/nextok/.cache
COPY --from=build /opt/nextok /opt/nextok
ENV PATH=/opt/nextok/bin:$PATH PYTHONUNBUFFERED=1 HOME=/home/nextok

USER 10001:10001
WORKDIR /home/nextok
# The default model (~100 MB) is pulled at build time so a container starts offline; a named volume
# mounted here starts from this copy and keeps the compiled kernels across restarts.
ARG PRELOAD_MODEL=true
RUN if [ "$PRELOAD_MODEL" = "true" ]; then python -m nextok.hub pull; fi
VOLUME ["/home/nextok/.cache/nextok"]

EXPOSE 8000
# /health is liveness (the process answers); orchestrators use /ready for routing.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
# Exec form: nextok is PID 1 and gets SIGTERM itself; it then fails /ready, answers 503 to new
# requests and waits --shutdown-timeout (30 s) for in-flight ones. API key: NEXTOK_API_KEY.
STOPSIGNAL SIGTERM
ENTRYPOINT ["nextok", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--log-format", "json"]
