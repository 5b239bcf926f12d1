#!/usr/bin/env bash
# The main job: set up, train the `demo` RePlaid on the embedded stdlib-docs corpus,
# evaluate its NELBO perplexity (next to the unigram perplexity of the same split), sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
OUT="${1:-runs/demo}"
export REPLAID_CACHE_DIR="${REPLAID_CACHE_DIR:-.cache/replaid}"
start=$(date +%s)
if [ -f "$OUT/config.json" ]; then
  echo "== $OUT already holds a run: resuming it if it was interrupted (a finished run is not retrained; delete it to retrain)"
  .venv/bin/replaid train --out "$OUT" --resume
else
  .venv/bin/replaid train --preset demo --out "$OUT"
fi
echo "== evaluation (valid split)"
.venv/bin/replaid eval "$OUT" --split valid --json | tee "$OUT/eval_valid.json"
.venv/bin/python - "$OUT/eval_valid.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"NELBO perplexity {r['nelbo_ppl']:.2f} ({r['nelbo_nats_per_token']:.3f} nats/token, +-{r['stderr_nats']:.3f}) "
      f"vs unigram perplexity {r['unigram_ppl']:.2f} on {r['tokens']} {r['split']} tokens")
PY
echo "== samples (DDPM ancestral, T=64)"
.venv/bin/replaid sample "$OUT" --sampler ddpm --steps 64 --num 3 --seed 0
echo "== demo finished in $(( $(date +%s) - start )) s (after set-up)"
