#!/usr/bin/env bash
# Build the local base image (default tag raftlog-base:local) without any image registry.
#
# Theory of operation. Our machines reach a Debian mirror and PyPI but no image registry, so
# no `FROM python:3.11-slim` can be pulled. Instead:
#   1. debootstrap a minimal Debian bookworm root (its python3 is 3.11) with python3-venv into
#      build/base-rootfs, from the mirror that this host's apt is configured with (read from
#      /etc/apt/sources.list*; no mirror host is written in this repository);
#   2. `docker import` that folder as the base image, with PATH/LANG set;
# then `make image` builds the wheelhouse on the host (`pip wheel` into build/wheels) and runs
# `docker build --build-arg BASE=raftlog-base:local`, whose install step is offline.
# An existing base image is kept (the debootstrap is the slow part); FORCE=1 rebuilds it.
#
# Usage: deploy/build-base-image.sh [TAG]      (needs root for debootstrap, and docker)
set -euo pipefail

tag="${1:-raftlog-base:local}"
suite="bookworm"
root_dir="$(cd "$(dirname "$0")/.." && pwd)"
rootfs="${root_dir}/build/base-rootfs"

if [[ "${FORCE:-0}" != "1" ]] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "base image $tag exists (FORCE=1 to rebuild)"
    exit 0
fi
if [[ "$(id -u)" != "0" ]]; then
    echo "error: debootstrap needs root (run this script with sudo)" >&2
    exit 1
fi
# Every machine starts fresh: fetch debootstrap from Debian's packages when it is missing.
if ! command -v debootstrap >/dev/null && command -v apt-get >/dev/null; then
    echo "installing debootstrap (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
if ! command -v debootstrap >/dev/null; then
    echo "error: debootstrap not found and apt-get could not install it" >&2
    echo "       (install it with: apt-get install -y debootstrap)" >&2
    exit 1
fi

# The first URI that this host's apt uses for "$suite" itself (not -updates/-security), from
# deb822 .sources paragraphs or one-line .list entries.
mirror_from_apt() {
    local file
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
        /etc/apt/sources.list.d/*.list; do
        [[ -f "$file" ]] || continue
        if [[ "$file" == *.sources ]]; then
            awk -v suite="$suite" '
                function flush() { if (uris != "" && (" " suites " ") ~ (" " suite " ")) {
                    split(uris, u, " "); print u[1]; found = 1; exit } uris = ""; suites = "" }
                /^[[:space:]]*$/ { flush(); next }
                /^URIs:/ { sub(/^URIs:[[:space:]]*/, ""); uris = $0 }
                /^Suites:/ { sub(/^Suites:[[:space:]]*/, ""); suites = $0 }
                END { if (!found) flush() }' "$file"
        else
            awk -v suite="$suite" '$1 == "deb" {
                for (i = 2; i <= NF; i++) if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; continue }
                else { uri = $i; if ($(i + 1) == suite) { print uri; exit } break } }' "$file"
        fi
    done | head -n 1
}

mirror="${DEBIAN_MIRROR:-$(mirror_from_apt)}"
if [[ -z "$mirror" ]]; then
    echo "error: no apt source for '$suite' in /etc/apt/sources.list*; set DEBIAN_MIRROR" >&2
    exit 1
fi

echo "debootstrap $suite from $mirror into $rootfs (a few minutes)"
rm -rf "$rootfs"
mkdir -p "$rootfs"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$suite" "$rootfs" "$mirror"
# Keep the image small: no package lists or .deb cache are needed at run time.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
chroot "$rootfs" python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version'

echo "docker import -> $tag"
tar -C "$rootfs" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$tag"
rm -rf "$rootfs"
docker run --rm "$tag" python3 -c 'import sys, venv; print("base python", sys.version.split()[0])'
