# raftlog node image.
#
#   docker build -t raftlog:local .          # base python:3.11-slim, dependencies from PyPI
#   make image                               # registry-free and offline (deploy/README.md)
#
# BASE is any image with python3 3.11+ and its venv module: the official python:3.11-slim by
# default, or raftlog-base:local that deploy/build-base-image.sh imports from a debootstrap.
# `make image` first fills build/wheels on the host with `pip wheel` (deps/: the dependencies,
# project/: raftlog's own wheel, built reproducibly), and then every install below is offline
# (--no-index). Without that wheelhouse, pip builds raftlog from the copied sources and fetches
# its dependencies from PyPI. The layers go from rarely to often changed, so an edit to the
# sources reinstalls only raftlog's own small wheel.
ARG BASE=python:3.11-slim

FROM ${BASE} AS install
# pyproject.toml is listed so that each COPY has a source when build/wheels is absent.
COPY pyproject.toml build/wheels/dep[s] /wheels/deps/
RUN set -eu; \
    python3 -m venv /opt/raftlog; \
    if ls /wheels/deps/*.whl >/dev/null 2>&1; then \
        /opt/raftlog/bin/pip install --no-index --no-cache-dir --find-links /wheels/deps \
            /wheels/deps/*.whl; \
    fi
COPY pyproject.toml build/wheels/projec[t] /wheels/project/
RUN set -eu; \
    if ls /wheels/project/raftlog-*.whl >/dev/null 2>&1; then \
        /opt/raftlog/bin/pip install --no-index --no-cache-dir --no-deps \
            /wheels/project/raftlog-*.whl; \
    fi
COPY . /src
RUN set -eu; \
    if ! /opt/raftlog/bin/python -c 'import raftlog' 2>/dev/null; then \
        /opt/raftlog/bin/pip install --no-cache-dir /src; \
    fi; \
    /opt/raftlog/bin/raftlog --version

# The runtime stage holds the venv only: no sources, wheels or pip caches.
FROM ${BASE}
# A fixed uid so that named volumes and bind mounts get a predictable owner; /data is the
# node's data directory (compose mounts one named volume per node there). No VOLUME line: an
# anonymous volume per container would leak with every `docker rm` of the chaos backend.
RUN useradd --system --uid 10001 --user-group --home-dir /data raftlog \
    && mkdir -p /data && chown raftlog:raftlog /data
COPY --from=install /opt/raftlog /opt/raftlog
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
