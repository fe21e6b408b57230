# raftlog node image.
#
#   docker build -t raftlog:local .          # base python:3.11-slim, dependencies from PyPI
#   make image                               # registry-free and offline (deploy/README.md)
#
# BASE is any image with python3 3.11+ and its venv module: the official python:3.11-slim by
# default, or raftlog-base:local that deploy/build-base-image.sh imports from a debootstrap.
# `make image` first fills build/wheels on the host with `pip wheel` (deps/: the dependencies,
# project/: raftlog's own wheel, built reproducibly), and then every install below is offline
# (--no-index). Without that wheelhouse, pip builds raftlog's wheel from the copied sources and
# fetches the dependencies from PyPI. The venv with the dependencies and raftlog's small wheel
# are separate layers, so an edit to the sources reinstalls only raftlog.
ARG BASE=python:3.11-slim

# The venv with raftlog's dependencies; /opt/raftlog/.offline records that they came from the
# wheelhouse, so the last install may (and must) skip the index too.
FROM ${BASE} AS deps
# pyproject.toml is listed so that the COPY has a source when build/wheels is absent.
COPY pyproject.toml build/wheels/dep[s] /wheels/deps/
RUN set -eu; \
    python3 -m venv /opt/raftlog; \
    if ls /wheels/deps/*.whl >/dev/null 2>&1; then \
        /opt/raftlog/bin/pip install --no-index --no-cache-dir /wheels/deps/*.whl; \
        touch /opt/raftlog/.offline; \
    fi

# raftlog's own wheel: the wheelhouse's, or built here from the sources.
FROM ${BASE} AS project
COPY pyproject.toml README.md /src/
COPY raftlog /src/raftlog
COPY metadata /src/metadata
COPY partition /src/partition
COPY rpc /src/rpc
COPY connectors /src/connectors
COPY chaos /src/chaos
COPY pyproject.toml build/wheels/projec[t] /src/wheelhouse/
RUN set -eu; \
    mkdir -p /wheels; \
    if ls /src/wheelhouse/raftlog-*.whl >/dev/null 2>&1; then \
        cp /src/wheelhouse/raftlog-*.whl /wheels/; \
    else \
        python3 -m venv /tmp/build; \
        /tmp/build/bin/pip wheel --no-deps --no-cache-dir --wheel-dir /wheels /src; \
    fi; \
    test "$(ls /wheels | wc -l)" = 1

FROM ${BASE}
# A fixed uid so that named volumes and bind mounts get a predictable owner; /data is the
# node's data directory (compose mounts one named volume per node there). No VOLUME line: an
# anonymous volume per container would leak with every `docker rm` of the chaos backend.
RUN useradd --system --uid 10001 --user-group --home-dir /data raftlog \
    && mkdir -p /data && chown raftlog:raftlog /data
COPY --from=deps /opt/raftlog /opt/raftlog
COPY --from=project /wheels /tmp/wheels
RUN set -eu; \
    offline=""; \
    if [ -e /opt/raftlog/.offline ]; then offline="--no-index"; fi; \
    /opt/raftlog/bin/pip install $offline --no-cache-dir /tmp/wheels/raftlog-*.whl; \
    rm -rf /tmp/wheels; \
    /opt/raftlog/bin/raftlog --version
ENV PATH=/opt/raftlog/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER raftlog
WORKDIR /data
# Clients on 9092 and node-to-node traffic on 9191 in the compose files (the chaos suite's docker
# backend uses 9092 and 9093); ports are flags of `raftlog serve`, so this is documentation.
EXPOSE 9092 9191
ENTRYPOINT ["raftlog"]
CMD ["--help"]
