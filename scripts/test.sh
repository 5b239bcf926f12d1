#!/usr/bin/env bash
# Set up, then run the whole test suite (slow and distributed tests included; GPU tests skip on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q tests "$@"
