# nextok on CPU. Build: docker build -t nextok:cpu .   Run: docker compose -f docker-compose.simple.yml up
# Two stages: the build stage installs nextok into a virtual environment, the runtime stage copies
# only that environment; both on the same pinned base, so the venv's interpreter path holds.
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
