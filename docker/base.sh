#!/usr/bin/env bash
# An offline base image for docker/Dockerfile, built from the distribution's packages, for hosts
# that reach an apt mirror but no image registry:
#   bash docker/base.sh [NAME]        # default seedflood-base:bookworm; a no-op when NAME exists
#   docker build -f docker/Dockerfile --build-arg BASE=seedflood-base:bookworm ...
# debootstrap (minbase) of Debian SUITE with python3 + python3-venv into a temporary directory,
# imported as NAME (`docker import`: no registry, no pull). SUITE must ship the Python the torch
# wheel is built for (bookworm: 3.11). MIRROR defaults to the first Debian mirror apt uses here.
# Needs root, debootstrap and a running docker daemon.
set -euo pipefail

NAME=${1:-seedflood-base:bookworm}
SUITE=${SUITE:-bookworm}

if docker image inspect "$NAME" >/dev/null 2>&1; then
    echo "base.sh: $NAME exists"
    exit 0
fi
if [[ -z ${MIRROR:-} ]]; then
    # deb822 (URIs: ...) or one-line (deb URI SUITE ...) sources; the first plain Debian archive
    MIRROR=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | sed -nE 's#^(URIs:|deb)[[:space:]]+(\[[^]]*\][[:space:]]+)?(https?://[^[:space:]]*/debian)/?([[:space:]].*)?$#\3#p' \
        | head -n1 || true)
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi
command -v debootstrap >/dev/null || PATH=$PATH:/usr/sbin:/sbin
root=$(mktemp -d /tmp/seedflood-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
t=$SECONDS
echo "base.sh: debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-venv "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 \
    || { tail -n 30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# What a container never needs: package downloads and indexes, docs, man pages.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
tar -C "$root" -c . | docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$NAME" >/dev/null
echo "base.sh: $NAME built in $((SECONDS - t)) s ($(docker image inspect -f '{{.Size}}' "$NAME") bytes)"
