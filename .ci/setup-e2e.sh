#!/usr/bin/env bash
# Install what the e2e tests need (idempotent; a no-op when everything is there):
#   bash .ci/setup-e2e.sh
# SLURM + munge (a throwaway cluster), iproute2 + nftables (network namespaces, tbf, packet loss),
# docker.io + docker-compose + debootstrap (the compose files on a real daemon,
# tests/e2e/test_compose_docker.py: dockerd is started when none answers; the images are built by
# that test's session fixture, beside the other tests rather than before them: the offline base
# (docker/base.sh, debootstrap) when no base is there, then the project's (docker/build.sh)).
# Debian/Ubuntu as root only; elsewhere it says why and exits 0, and the e2e tests that need the
# missing pieces skip with that reason (the docker ones fail under CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(slurm-wlm munge iproute2 nftables docker.io docker-compose debootstrap)
NEEDED=(slurmctld slurmd sbatch munged ip tc nft dockerd docker docker-compose debootstrap)

install_missing() {
    local missing=() bin
    for bin in "${NEEDED[@]}"; do
        command -v "$bin" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
    done
    if (( ${#missing[@]} == 0 )); then
        echo "setup-e2e: everything present"
        return 0
    fi
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "setup-e2e: missing ${missing[*]}; not root or no apt-get, so the e2e tests needing them will skip"
        exit 0
    fi
    echo "setup-e2e: installing ${PACKAGES[*]} (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get update -qq
    timeout 900 apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
    echo "setup-e2e: done"
}

# A daemon, started here when none answers (a CI machine may have no init system to start it).
start_docker() {
    PATH=$PATH:/usr/sbin:/sbin
    if [[ $(id -u) -ne 0 ]] || ! command -v dockerd >/dev/null 2>&1; then
        echo "setup-e2e: no dockerd or not root: the docker compose tests skip (fail under CI=true)"
        return 0
    fi
    local log=/var/log/seedflood-dockerd.log
    if docker info >/dev/null 2>&1; then
        echo "setup-e2e: a docker daemon answers"
        return 0
    fi
    echo "setup-e2e: starting dockerd (log: $log)"
    setsid dockerd >"$log" 2>&1 </dev/null &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && return 0; sleep 1; done
    echo "setup-e2e: dockerd did not answer in 60 s:"
    tail -n 20 "$log"
    return 1
}

install_missing
start_docker
