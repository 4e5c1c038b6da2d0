#!/usr/bin/env bash
# Install what this project needs on a fresh Debian 12 machine: system packages
# (apt) and a virtual environment in .venv with the package in editable mode.
#
#   scripts/install.sh          runtime + embedded stack (Kafka broker, S3 store, Triton)
#                               + DALI (the audio stage of topologies/audio.yaml); Apache Kafka's
#                               broker jars too wherever Java 17+ and Maven are installed (the
#                               embedded stack's default broker then; Tansu where they are not)
#   scripts/install.sh --test   the same plus matplotlib (`pipeline bench --plot`) and the test tools,
#                               and Apache Kafka's jars are required (as --kafka)
#   scripts/install.sh --kafka  Apache Kafka's broker jars from Maven Central are required: an error
#                               without Java 17+ and Maven (`java`, `mvn`) already installed
#
# Extras (pyproject.toml): embedded = the local stack, audio = NVIDIA DALI, plot = matplotlib,
# test = the test tools (faust-streaming included). The core alone is `pip install .`.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="embedded,audio"
kafka=0
for arg in "$@"; do
    case "$arg" in
        --test) extras="embedded,audio,plot,test"; kafka=1 ;;  # the tests exercise the DALI stage, the plot and Apache Kafka
        --kafka) kafka=1 ;;
        *) echo "usage: scripts/install.sh [--test] [--kafka]" >&2; exit 2 ;;
    esac
done

# Apache Kafka (KRaft) for `pipeline up --broker kafka` and tests/integration/test_apache_kafka.py: Maven
# resolves the broker's jars from scripts/kafka/pom.xml into .cache/kafka/VERSION/lib (git-ignored).
# Skipped when that folder already holds them; no archive is downloaded by hand.
install_kafka() {
    local missing_tool
    for missing_tool in java mvn; do
        if ! command -v "$missing_tool" >/dev/null; then
            echo "error: Apache Kafka needs Java 17+ and Maven; '$missing_tool' is not on PATH (apt-get install openjdk-17-jre-headless maven)" >&2
            exit 1
        fi
    done
    local java_major version lib
    java_major=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = \([0-9]*\).*/\1/p')
    if [[ -z "$java_major" || "$java_major" -lt 17 ]]; then
        echo "error: Apache Kafka needs Java 17+; 'java' is version ${java_major:-unknown}" >&2
        exit 1
    fi
    version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' scripts/kafka/pom.xml)
    lib=".cache/kafka/${version}/lib"
    if compgen -G "${lib}/kafka_2.13-${version}.jar" >/dev/null; then
        echo "Apache Kafka ${version} jars already in ${lib}"
        return
    fi
    echo "resolving Apache Kafka ${version} broker jars with Maven into ${lib}"
    rm -rf "${lib}.partial"
    mvn -B -q -Dstyle.color=never -f scripts/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$PWD/${lib}.partial"
    rm -rf "${lib}"
    mv "${lib}.partial" "${lib}"
}

# libpython3.11: embedded by Triton's Python-backend stub.
# espeak-ng: speech for the VAD tests and the audio demo. kcat: a third-party Kafka client.
# docker-compose: validates docker-compose.yaml offline (no engine is needed or started).
# prometheus: a real Prometheus server and promtool (alert rules checked and unit-tested, a real scrape).
apt_packages=(libpython3.11 espeak-ng kcat docker-compose prometheus)
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
if ((kafka)); then
    install_kafka
elif command -v java >/dev/null && command -v mvn >/dev/null; then
    # Not asked for, but this machine can run it: the embedded stack's default broker. A
    # failure here (no Maven Central, Java too old) leaves Tansu the default, as without Java.
    (install_kafka) || echo "warning: Apache Kafka's jars were not fetched; the embedded stack runs Tansu" >&2
fi
