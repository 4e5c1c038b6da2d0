#!/usr/bin/env bash
# Install what this project needs on a fresh Debian 12 machine: system packages
# (apt) and a virtual environment in .venv with the package in editable mode.
#
#   scripts/install.sh          runtime + embedded stack (Kafka broker, S3 store, Triton)
#                               + DALI (the audio stage of topologies/audio.yaml)
#   scripts/install.sh --test   the same plus matplotlib (`pipeline bench --plot`) and the test tools
#
# Extras (pyproject.toml): embedded = the local stack, audio = NVIDIA DALI, plot = matplotlib,
# test = the test tools (faust-streaming included). The core alone is `pip install .`.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="embedded,audio"
if [[ "${1:-}" == "--test" ]]; then
    extras="embedded,audio,plot,test"   # the tests exercise the DALI stage and the plot
fi

# libpython3.11: embedded by Triton's Python-backend stub.
# espeak-ng: speech for the VAD tests and the audio demo. kcat: a third-party Kafka client.
# stunnel4 + openssl: TLS in front of the embedded broker and S3 store for the transport-security tests.
# docker-compose: validates docker-compose.yaml offline (no engine is needed or started).
# prometheus: a real Prometheus server and promtool (alert rules checked and unit-tested, a real scrape).
apt_packages=(libpython3.11 espeak-ng kcat stunnel4 openssl docker-compose prometheus)
missing=()
for pkg in "${apt_packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
# kubectl (1.32, kustomize 5.5) renders `pipeline deploy k8s` output in the tests. It comes from
# Google's cloud-sdk apt repository (packages.cloud.google.com/apt cloud-sdk-bookworm); Debian's
# own kubernetes-client is 1.20. Asked for only with --test, and only where an apt source has it:
# otherwise the render test fails and names it.
if [[ "$extras" == *test* ]] && ! command -v kubectl >/dev/null; then
    if apt-cache policy kubectl 2>/dev/null | grep -q "Candidate: [0-9]"; then
        missing+=(kubectl)
    else
        echo "warning: no apt source offers kubectl (add Google's cloud-sdk repository); the kustomize render test will fail" >&2
    fi
fi
if ((${#missing[@]})); then
    sudo_cmd=()
    [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    echo "installing system packages: ${missing[*]}"
    "${sudo_cmd[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

python=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[${extras}]"
echo "installed into .venv (extras: ${extras})"
