#!/usr/bin/env bash
# Create .venv (if missing) and install replaid with its dependencies. Idempotent.
# usage: bash scripts/setup.sh          every extra (.[all]) and chromium: what the test suite needs (scripts/test.sh)
#        bash scripts/setup.sh --core   the core package only: what the demo imports (scripts/demo.sh; issue 54)
# torch is pinned to 2.13.0: on these machines pip finds its CPU wheel locally; elsewhere
# pip fetches the matching wheel (with CUDA packages on Linux) from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
WHAT=".[all]"
case "${1:-}" in
  "") ;;
  --core) WHAT="." ;;
  *) echo "replaid: error: unknown option $1 (bash scripts/setup.sh [--core])" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# pip's lines pass (its errors stop the set-up) except this machine's notes on missing local index folders
quiet() { grep -v "^WARNING: Location" || true; }
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" 2>&1 | quiet
.venv/bin/python -m pip install -q --disable-pip-version-check -c scripts/constraints.txt -e "$WHAT" 2>&1 | quiet
if [ "$WHAT" = "." ]; then
  .venv/bin/python -c "import torch, replaid; print(f'replaid {replaid.__version__} (core) with torch {torch.__version__} ready in .venv')"
  exit 0
fi
# `lm_eval --model replaid` (the harness's own CLI finds no plugins): a .pth line adds replaid's import hook
# (a wheel carries the file; an editable install does not)
.venv/bin/python -m replaid._lmeval_pth >/dev/null
# The browser tests of `replaid serve` drive Debian's chromium (never a downloaded browser build).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "installing chromium for the browser tests (apt-get)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "warning: could not install chromium; the browser tests will be skipped"
fi
.venv/bin/python -c "import torch, replaid; print(f'replaid {replaid.__version__} with torch {torch.__version__} ready in .venv')"
