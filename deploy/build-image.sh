#!/usr/bin/env bash
# `make image`: build raftlog:local with no image registry (base from debootstrap, wheels
# built on this host, offline install in the image).
#
# Theory of operation. Three cached steps, each skipped when its output is current:
#   1. deploy/build-base-image.sh: raftlog-base:local (Debian bookworm + python3 3.11), kept
#      once built because the debootstrap is the slow part (about 3 minutes);
#   2. `pip wheel` on the host into build/wheels: project/ holds the project's wheel, built
#      from a clean copy of the sources (setuptools' in-tree build/lib would otherwise keep
#      deleted modules), deps/ the wheels of all its dependencies (pip's cache or PyPI);
#   3. `docker build --build-arg BASE=raftlog-base:local`, whose pip install is --no-index.
# Usage: deploy/build-image.sh [TAG]   (env: BASE_TAG, PYTHON, FORCE=1 rebuilds the base)
set -euo pipefail

tag="${1:-raftlog:local}"
base_tag="${BASE_TAG:-raftlog-base:local}"
root_dir="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-${root_dir}/.venv/bin/python}"
wheels="${root_dir}/build/wheels"
cd "$root_dir"

# Move fresh wheels into build/wheels/deps and build/wheels/project, touching only files that
# changed and dropping ones no longer needed, so unchanged layers stay cached.
sync_wheelhouse() {
    local fresh="$1" dir file wheel
    mkdir -p "$wheels/deps" "$wheels/project"
    rm -f "$wheels"/*.whl
    for dir in deps project; do
        for file in "$wheels/$dir"/*.whl; do
            if [[ -e "$file" && ! -e "$fresh/$(basename "$file")" ]]; then rm -f "$file"; fi
        done
    done
    for wheel in "$fresh"/*.whl; do
        case "$(basename "$wheel")" in raftlog-*) dir=project ;; *) dir=deps ;; esac
        if ! cmp -s "$wheel" "$wheels/$dir/$(basename "$wheel")"; then
            cp "$wheel" "$wheels/$dir/"
        fi
    done
}

"$root_dir/deploy/build-base-image.sh" "$base_tag"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/wheels"
cp -r pyproject.toml README.md raftlog metadata partition rpc connectors chaos "$work/src/"
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
echo "pip wheel -> $wheels/{deps,project}"
# SOURCE_DATE_EPOCH makes raftlog's wheel byte-identical while its sources are, so docker's
# layer cache holds across runs.
SOURCE_DATE_EPOCH=315532800 "$python" -m pip wheel --quiet --wheel-dir "$work/wheels" "$work/src"
ls "$work/wheels"/raftlog-*.whl >/dev/null
sync_wheelhouse "$work/wheels"

# Without the buildx plugin the docker CLI falls back to the classic builder; say so up front
# instead of letting BuildKit fail.
if ! docker buildx version >/dev/null 2>&1; then
    export DOCKER_BUILDKIT=0
fi
# The classic builder leaves the images it replaces untagged, so each stage is tagged (the deps
# stage's venv layer is also the cache of the next build, and the slow part to rebuild) and
# what the tags named before is removed afterwards unless a container still uses it.
deps_tag="${tag%:*}-deps:${tag##*:}"
project_tag="${tag%:*}-project:${tag##*:}"
tags=("$deps_tag" "$project_tag" "$tag")
previous_ids="$(docker image inspect --format '{{.Id}}' "${tags[@]}" 2>/dev/null || true)"
echo "docker build -> $tag (BASE=$base_tag)"
docker build --quiet --build-arg "BASE=$base_tag" --target deps --tag "$deps_tag" .
docker build --quiet --build-arg "BASE=$base_tag" --target project --tag "$project_tag" .
docker build --quiet --build-arg "BASE=$base_tag" --tag "$tag" .
current_ids="$(docker image inspect --format '{{.Id}}' "${tags[@]}")"
for id in $previous_ids; do
    if ! grep -q "$id" <<<"$current_ids"; then docker rmi "$id" >/dev/null 2>&1 || true; fi
done
docker run --rm "$tag" --version
