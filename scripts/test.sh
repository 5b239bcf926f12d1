#!/usr/bin/env bash
# Set up, check the code (ruff lint + format, the import-layers contract, mypy), then run the whole
# test suite (slow and distributed tests included; GPU tests skip on CPU). The checks are configured in
# pyproject.toml; .pre-commit-config.yaml runs the same ones before a commit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff check, ruff format --check, lint-imports, mypy"
.venv/bin/ruff check src tests benchmarks scripts setup.py docs/tutorials
.venv/bin/ruff format --check src tests benchmarks scripts setup.py docs/tutorials
.venv/bin/lint-imports
.venv/bin/mypy
exec .venv/bin/python -m pytest -q tests "$@"
