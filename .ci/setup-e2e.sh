#!/usr/bin/env bash
# Install what the e2e tests need (idempotent; a no-op when everything is there):
#   bash .ci/setup-e2e.sh
# SLURM + munge (a throwaway cluster), iproute2 + nftables (network namespaces, tbf, packet loss),
# docker-compose (offline validation of docker/compose.yaml). Debian/Ubuntu as root only; elsewhere
# it says why and exits 0, and the e2e tests that need the missing pieces skip with that reason.
set -euo pipefail

PACKAGES=(slurm-wlm munge iproute2 nftables docker-compose)
NEEDED=(slurmctld slurmd sbatch munged ip tc nft docker-compose)

missing=()
for bin in "${NEEDED[@]}"; do
    command -v "$bin" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "$bin" >/dev/null 2>&1 || missing+=("$bin")
done
if (( ${#missing[@]} == 0 )); then
    echo "setup-e2e: everything present"
    exit 0
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
