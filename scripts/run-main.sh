#!/usr/bin/env bash
# The README's main command: installs dependencies, fetches the corpus, builds, and trains the
# small character GPT with every operator as its own actor (configs/runs/char-small.ini).
# Extra arguments go to fusion-train, e.g. scripts/run-main.sh --train.steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/get-data.sh data
./scripts/build.sh
./build/apps/fusion-train --config configs/runs/char-small.ini "$@"
