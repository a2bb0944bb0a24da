#!/usr/bin/env bash
# Build the image from the working tree (docker/Dockerfile):
#   bash docker/build.sh [TAG]            # default seedflood:cpu; `make image` runs this
# The context is a tar of what the image copies (setup.cfg, pyproject.toml, README.md, src/,
# topologies/, launch/, docker/Dockerfile) plus docker/inputs/, streamed to `docker build -`:
# the same with the classic builder and BuildKit, and nothing of .venv or runs/ is sent.
# docker/inputs/ gets, besides what is already there, the host's own (the build stage only):
#   WHEELS     folders holding local torch wheels (default: pip's find-links; none: the index)
#   CA_BUNDLE  the CA bundle pip trusts (default: PIP_CERT, else pip's `cert` setting; none: pip's own)
#   LOCK       a requirements lock pinning setup.cfg's dependencies (default: requirements/cpu.txt,
#              what `make install` installs; LOCK= builds from setup.cfg's ranges)
# Build arguments: BASE (default: the offline base seedflood-base:bookworm of docker/base.sh when
# that image exists, else python:3.11-slim), TORCH_SPEC, TORCH_INDEX, DATA_PKGS when set;
# BUILD_FLAGS: more `docker build` flags (e.g. --no-cache).
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${1:-seedflood:cpu}
OFFLINE_BASE=seedflood-base:bookworm
if [[ -z ${BASE:-} ]]; then
    BASE=python:3.11-slim
    docker image inspect "$OFFLINE_BASE" >/dev/null 2>&1 && BASE=$OFFLINE_BASE
fi
pip_setting() {  # pip's configured value of $1, empty when none (or no pip)
    ${PYTHON:-python3} -m pip config get "global.$1" 2>/dev/null || true
}
WHEELS=${WHEELS-${PIP_FIND_LINKS:-$(pip_setting find-links)}}
CA_BUNDLE=${CA_BUNDLE-${PIP_CERT:-$(pip_setting cert)}}

stage=$(mktemp -d /tmp/seedflood-build.XXXXXX)
trap 'rm -rf "$stage"' EXIT
inputs=$stage/docker/inputs
mkdir -p "$inputs/wheels"
cp -R docker/inputs/. "$inputs/"
rm -f "$inputs/README.md" "$inputs/.gitignore"
put() {  # put FILE DEST: a hard link when it can (no copy of a 200 MB wheel), else a copy
    ln -f "$1" "$2" 2>/dev/null || cp "$1" "$2"
}
for dir in $WHEELS; do
    dir=${dir#file://}
    [[ -d $dir ]] || continue  # an index URL: pip inside the build reaches it or not on its own
    for whl in "$dir"/torch-*.whl; do
        [[ -f $whl ]] && put "$whl" "$inputs/wheels/"
    done
done
if [[ -n $CA_BUNDLE && -f $CA_BUNDLE ]]; then
    cp "$CA_BUNDLE" "$inputs/ca.crt"
fi
LOCK=${LOCK-requirements/cpu.txt}
if [[ -n $LOCK ]]; then
    cp "$LOCK" "$inputs/lock.txt"
fi

args=(--build-arg "BASE=$BASE")
for name in TORCH_SPEC TORCH_INDEX DATA_PKGS; do
    [[ -n ${!name:-} ]] && args+=(--build-arg "$name=${!name}")
done
echo "build.sh: $TAG from $BASE; inputs: $(cd "$inputs" && find . -type f | sed 's#^\./##' | tr '\n' ' ')" >&2
t=$SECONDS
tar -c --exclude=__pycache__ --exclude='*.egg-info' \
    setup.cfg pyproject.toml README.md src topologies launch docker/Dockerfile \
    -C "$stage" docker/inputs \
    | docker build --force-rm ${BUILD_FLAGS:-} "${args[@]}" -f docker/Dockerfile -t "$TAG" -
echo "build.sh: $TAG built in $((SECONDS - t)) s, $(docker image inspect -f '{{.Size}}' "$TAG") bytes" >&2
