#!/usr/bin/env bash
# Issue 52 §1 end to end: train the frontier's runs (docs/results/blocks/frontier.yaml: AR, RePlaid and MDLM
# with blocks of 4 and 16, 2 seeds) and a separate AR judge, distil each RePlaid block run's per-block PF-ODE
# progressively from 64 to 1 step per block (the rounds' checkpoints at 4 and 2 steps are those students),
# then score every configuration through the served path (scripts/serve_frontier.py: GenPPL under the judge
# at temperature 1 and at AR's entropy, MAUVE, repeated 4-grams at 1x and 4x; tokens/s, time to first token
# and memory at batch 1 and 16). Every stage skips what is already done, so a stopped call resumes.
#
#   bash scripts/frontier.sh                                   # CPU: runs/frontier, the page's data
#   bash scripts/frontier.sh --device cuda --data .gl/linux-docs --parallel 10   # a lent GPU
#   bash scripts/frontier.sh --seeds 1          # training seeds as 'replaid grid plan --seeds' (1: seed 0 only):
#                                               # planned, trained, distilled and scored; the rest wait for a later call
#   bash scripts/frontier.sh --tiny --runs /tmp/frontier-tiny --out /tmp/frontier-tiny/page   # minutes, CPU
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=runs/frontier OUT=docs/results/blocks/frontier PAR=2 DEVICE=cpu DATA="" TINY=0 TRAIN_SEEDS=()
die() { echo "replaid: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --runs) RUNS=${2:?}; shift ;;
    --out) OUT=${2:?}; shift ;;
    --parallel) PAR=${2:?}; shift ;;
    --device) DEVICE=${2:?}; shift ;;
    --data) DATA=${2:?}; shift ;;
    --tiny) TINY=1 ;;
    --seeds) shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do TRAIN_SEEDS+=("$1"); shift; done
             [ ${#TRAIN_SEEDS[@]} -gt 0 ] || die "--seeds needs a count or a list of training seeds, as replaid grid plan's (e.g. --seeds 1: seed 0 only)"; continue ;;
    *) die "unknown argument '$1' to scripts/frontier.sh: see its header for the options" ;;
  esac
  shift
done
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || die "no Python at $PY: run 'bash scripts/setup.sh' first, or set PYTHON"
SET=(train.device="$DEVICE")
[ -n "$DATA" ] && SET+=(data.source="$DATA")
# the judge: AR, its own seed, twice the steps; --tiny: everything at the debug size on the embedded corpus
JUDGE_SET=(train.seed=100 train.steps=4800 train.eval_every=2400)
ROUND=200 FROM=64 NUM=32 SEEDS=(0 1 2) BATCHES=(1 16) LENGTHS=(1 4) ITERS=6
if [ $TINY = 1 ]; then
  SET+=(data.source=stdlib data.bpe_vocab_size=300 model.hidden=32 model.n_layers=1 model.n_heads=2
        model.cond_dim=16 train.steps=8 train.eval_every=8 train.save_every=8 eval.max_batches=1 eval.t_samples=1
        data.seq_len=16)
  JUDGE_SET=(train.seed=100 train.steps=8)
  ROUND=2 FROM=8 NUM=2 SEEDS=(0) BATCHES=(1) LENGTHS=(1) ITERS=1
fi
stamp() { echo "$(date +%T) $*" >&2; }

# 1. the grid and the judge
PLAN_SEEDS=(); [ ${#TRAIN_SEEDS[@]} -gt 0 ] && PLAN_SEEDS=(--seeds "${TRAIN_SEEDS[@]}")
[ -f "$RUNS/manifest.json" ] || "$PY" -m replaid grid plan docs/results/blocks/frontier.yaml "${SET[@]}" \
  "${PLAN_SEEDS[@]}" --out "$RUNS" >&2
stamp "training the grid ($RUNS)"
"$PY" -m replaid grid run "$RUNS" --max-parallel "$PAR" --no-progress "${PLAN_SEEDS[@]}" >&2
# the seeds taken on: --seeds's (a count from 0 or a list), else every planned run's
WANT=("${TRAIN_SEEDS[@]}"); [ ${#WANT[@]} = 1 ] && WANT=($(seq 0 $((WANT[0] - 1))))
wanted() { [ ${#WANT[@]} = 0 ] || [[ " ${WANT[*]} " == *" $1 "* ]]; }
J="$RUNS/judge"
judge() {
  [ -f "$J/final_eval.json" ] && return 0
  stamp "training the judge ($J)"
  if [ -d "$J/checkpoints" ]; then "$PY" -m replaid train --out "$J" --resume --no-progress >&2
  else "$PY" -m replaid train --out "$J" --config "$RUNS/configs/ar__s0.json" "${JUDGE_SET[@]}" --no-progress >&2; fi
}
# with two or more lanes the judge trains beside the distillations
JUDGE_PID=""
# a failed stage stops the judge too (it saves a checkpoint on SIGTERM), so that a rerun never trains it twice
trap 'if [ -n "$JUDGE_PID" ]; then pkill -TERM -P "$JUDGE_PID" 2>/dev/null; wait "$JUDGE_PID" 2>/dev/null; fi' EXIT
if [ "$PAR" -ge 2 ]; then judge & JUDGE_PID=$!; else judge; fi

# 2. the per-block students: one progressive chain per RePlaid block run, FROM -> 1 step per block;
# the checkpoint after each round is the student of that round's steps
CONFIGS=() TEACHERS=() MATCH=""
for d in "$RUNS"/runs/*__s*; do
  cell=$(basename "$d"); name=${cell%__s*}; seed=${cell##*__s}
  wanted "$seed" || continue
  case $name in
    ar) label=AR ;;
    replaid-b4) label=RePlaid-B4 ;;
    replaid-b16) label=RePlaid-B16 ;;
    mdlm-b4) label=MDLM-B4 ;;
    mdlm-b16) label=MDLM-B16 ;;
    *) continue ;;
  esac
  if [ "$name" = ar ]; then CONFIGS+=(--config "AR-s$seed=$d"); MATCH=${MATCH:-AR-s$seed}; continue; fi
  CONFIGS+=(--config "$label-s$seed-T$FROM=$d:$FROM")
  case $name in
    mdlm-*) for k in 4 2 1; do CONFIGS+=(--config "$label-s$seed-T$k=$d:$k"); done ;;
    replaid-*)
      S="$RUNS/students/$cell"
      if [ ! -f "$S/checkpoints/LATEST" ] || ! "$PY" - "$S" <<'EOF'
import json, sys
from pathlib import Path
s = Path(sys.argv[1]) / "checkpoints"
st = json.loads((s / (s / "LATEST").read_text().strip() / "state.json").read_text())
sys.exit(0 if st.get("distill", {}).get("student_steps") == 1 else 1)
EOF
      then
        stamp "distilling $cell: $FROM -> 1 step per block ($S)"
        resume=(); [ -f "$S/checkpoints/LATEST" ] && resume=(--resume)
        "$PY" -m replaid distill "$d" --out "$S" --from-steps "$FROM" --to-steps 1 --steps-per-round "$ROUND" \
          --save-every "$ROUND" --device "$DEVICE" --no-progress "${resume[@]}" >&2
      fi
      for k in 4 2 1; do
        r=0; n=$FROM; while [ "$n" -gt "$k" ]; do n=$((n / 2)); r=$((r + 1)); done
        ck=$(printf "%s/checkpoints/step_%07d" "$S" $((r * ROUND)))
        CONFIGS+=(--config "$label-s$seed-PD$k=$ck:$k")
        TEACHERS+=(--teacher "$label-s$seed-PD$k=$label-s$seed-T$FROM")
      done ;;
  esac
done

if [ -n "$JUDGE_PID" ]; then
  wait "$JUDGE_PID" || { JUDGE_PID=""; die "the judge's training failed (see above); rerun to resume it"; }
  JUDGE_PID=""
fi
[ -n "$MATCH" ] || die "no AR run among the seeds taken on in $RUNS: the entropy to match is AR's"

# 3. score every configuration on the served path (each configuration's quality, then speed; each part is
# kept in $OUT/rows as it lands, so a stopped call resumes)
stamp "scoring $((${#CONFIGS[@]} / 2)) configurations into $OUT"
MAUVE=(--mauve); [ $TINY = 1 ] && MAUVE=()
"$PY" scripts/serve_frontier.py --judge-run "$J" --match "$MATCH" "${CONFIGS[@]}" "${TEACHERS[@]}" \
  --lengths "${LENGTHS[@]}" --seeds "${SEEDS[@]}" --num "$NUM" --batches "${BATCHES[@]}" \
  --match-iters "$ITERS" "${MAUVE[@]}" --out "$OUT"
