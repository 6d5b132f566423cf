#!/usr/bin/env bash
# Installs every build, test and run dependency of FusionLLM from Debian's archive.
# Idempotent: packages already present are skipped by apt-get; safe to run repeatedly.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libcaf-dev libssl-dev
  libprotobuf-dev protobuf-compiler
  libboost-dev
  doctest-dev
  libopenblas-dev
  libedit-dev nlohmann-json3-dev libcli11-dev
  libpcre2-dev
  zlib1g-dev libxxhash-dev
  bible-kjv bible-kjv-text dataset-fashion-mnist
  iproute2 procps
  iptables  # tests/scripts/firewall_test.sh: a site that drops inbound connections
  tmux  # tests/apps/admin_watch_test.cpp: fusion-admin watch on a terminal
  libcpp-httplib-dev curl  # fusion-train metrics.port (Prometheus) and its test
  gnuplot-nox
  time  # bench/schedule_bench.sh: peak RSS per node process (GNU time %M)
  # scripts/fuzz.sh: clang with libFuzzer and the sanitizer runtimes (docs/security.md)
  clang libclang-rt-14-dev
)
# The PyTorch reference peer is only needed by the benchmarks.
if [[ "${FUSION_SETUP_BENCH:-0}" == "1" ]]; then
  packages+=(python3 python3-torch python3-numpy)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
