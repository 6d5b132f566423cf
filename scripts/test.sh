#!/usr/bin/env bash
# The README's test command: installs dependencies, fetches the corpus, builds, runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/get-data.sh data
./scripts/build.sh "$@"
jobs=$(nproc 2>/dev/null || echo 2)
cd build
ctest --output-on-failure -j "$jobs" --timeout 1200
