#!/usr/bin/env bash
# GPU acceptance in one command (issue 27): set-up without a network, correctness on CUDA, speed and
# memory at the paper's 0.1B size, one JSON + one markdown table.
#
#   bash scripts/gpu_check.sh --quick [--out DIR]        # on the GPU machine: fits one 10-minute call
#   bash scripts/gpu_check.sh [--steps a,b,c] [--out DIR] # the full check, or a subset of its steps
#   bash scripts/gpu_check.sh --dry-run [--quick]         # anywhere: the plan; every step's command resolved
#   bash scripts/gpu_check.sh --fetch-wheels [DIR]        # here, with a network: wheels the GPU machine lacks
#   bash scripts/gpu_check.sh --fetch-mdlm SNAPSHOT       # here: the MDLM reference into .carry/mdlm
#   bash scripts/gpu_check.sh --merge A.json B.json [--out DIR] [--record]   # several calls' results in one
#
# Set-up (every run but --dry-run/--merge/--fetch-*): the GPU machine reaches no registry and has its
# own Python ($PYTHON, default python3: 3.12 with a CUDA torch, 2.11 when last seen) with most of our
# dependencies. Wheels carried in .whl/ (made here by --fetch-wheels: what the MDLM reference needs
# and the image lacks) are installed with --no-index --no-deps into /tmp/replaid-site, then the
# project itself (--no-deps --no-build-isolation, against that torch; PYTHONPATH=src if that fails).
# It prints the device, driver, torch and CUDA versions and the set-up time (it counts against the lease).
# On the device tool: carry [".whl", ".carry"] and run e.g.
#   bash scripts/gpu_check.sh --quick --out $OUT
# A full check is longer than one call: split it with --steps as the dry run lists (each call writes its
# own gpu_check.json under $OUT), then here: --merge the fetched files --out docs/gpu_check --record.
#
# Steps (benchmarks/gpu_check/__init__.py has the details): env, tests, bf16, syncs, compile, speed, memory,
# sampler, likelihood, mdlm_ref, maxbatch, blocks, breakdown (all in --quick, sized down), speed_compiled, blocks_01b, serve,
# bf16_train, plateau_b512 (full only; both need linux-docs carried in .gl/).
# A failing step is recorded with its error and the rest go on. Exit status: 0 when every step that ran
# passed (the dry run: when every command resolved), 1 otherwise, 2 for bad input.
set -uo pipefail
cd "$(dirname "$0")/.."

# what the MDLM reference imports that the GPU image lacks (its requirements.yaml pins); antlr4 4.9.3
# (omegaconf's pin) exists only as a pure-Python sdist, so --fetch-wheels builds its wheel here.
# flash-attn: tried as a binary wheel; PyPI has none, so the reference then runs on a PyTorch SDPA shim.
WHEELS=("omegaconf==2.3.0" "hydra-core==1.3.2")
SDIST_WHEELS=("antlr4-python3-runtime==4.9.3")
OPTIONAL_WHEELS=("flash-attn")
WHEEL_DIR=.whl
CARRY_LIMIT_MB=48  # the device tool carries 64 MiB of working tree in all

die() { echo "replaid: error: $*" >&2; exit 2; }
stamp() { echo "[gpu_check $(date +%H:%M:%S)] $*"; }

if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ] && ! command -v nvidia-smi >/dev/null 2>&1; then PY=.venv/bin/python
else PY=python3; fi

MODE=run; QUICK=(); OUTDIR=""; STEPS=""; MERGE=(); RECORD=(); FETCH_DIR=""; SNAPSHOT=""; PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=(--quick) ;;
    --dry-run) MODE=dry ;;
    --out) [ $# -ge 2 ] || die "--out needs a folder, e.g. --out \$OUT"; OUTDIR=$2; shift ;;
    --steps) [ $# -ge 2 ] || die "--steps needs a comma-separated list, e.g. --steps speed,memory"; STEPS=$2; shift ;;
    --budget|--device|--mdlm-ref) [ $# -ge 2 ] || die "$1 needs a value (see --help)"; PASS+=("$1" "$2"); shift ;;
    --tiny) PASS+=(--tiny) ;;
    --fetch-wheels) MODE=wheels; if [ $# -ge 2 ] && [ "${2#-}" = "$2" ]; then FETCH_DIR=$2; shift; fi ;;
    --fetch-mdlm) [ $# -ge 2 ] || die "--fetch-mdlm needs a snapshot of kuleshov-group/mdlm (a git dir or a checkout)"
                  MODE=mdlm; SNAPSHOT=$2; shift ;;
    --merge) MODE=merge; shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do MERGE+=("$1"); shift; done; continue ;;
    --record) RECORD=(--record) ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' for scripts/gpu_check.sh; see 'bash scripts/gpu_check.sh --help'" ;;
  esac
  shift
done
[ -z "$STEPS" ] || PASS+=(--steps "$STEPS")

fetch_wheels() {
  local dir=${FETCH_DIR:-$WHEEL_DIR}
  mkdir -p "$dir" || die "cannot create $dir"
  local plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
              --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  local w
  for w in "${WHEELS[@]}"; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d "$dir" "$w" \
      || die "pip could not download $w (a network and PyPI are needed here)"
  done
  for w in "${SDIST_WHEELS[@]}"; do
    "$PY" -m pip wheel -q --no-deps --no-binary=:all: -w "$dir" "$w" || die "pip could not build a wheel of $w"
  done
  for w in "${OPTIONAL_WHEELS[@]}"; do
    if "$PY" -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d "$dir" "$w" >/dev/null 2>&1; then
      echo "$w: a binary wheel was found (the MDLM reference will try it)"
    else
      echo "$w: no binary wheel for cp312/manylinux x86_64 on the index; the MDLM reference will use its SDPA shim"
    fi
  done
  local mb
  mb=$(du -sm "$dir" | cut -f1)
  ls -1 "$dir"
  echo "$dir: ${mb} MB of wheels; carry it with the device tool (carry [\"$dir\", \".carry\"])"
  [ "$mb" -le "$CARRY_LIMIT_MB" ] || die "$dir holds ${mb} MB, over the ${CARRY_LIMIT_MB} MB this check allows itself \
of the 64 MiB that travels; remove what the GPU machine has"
}

fetch_mdlm() {
  local dest=.carry/mdlm rev=""
  rm -rf "$dest" && mkdir -p "$dest" || die "cannot create $dest"
  if git --git-dir="$SNAPSHOT" rev-parse --verify -q HEAD >/dev/null 2>&1; then
    rev=$(git --git-dir="$SNAPSHOT" rev-parse HEAD); git --git-dir="$SNAPSHOT" archive HEAD | tar -x -C "$dest"
  elif [ -d "$SNAPSHOT/.git" ]; then
    rev=$(git -C "$SNAPSHOT" rev-parse HEAD); git -C "$SNAPSHOT" archive HEAD | tar -x -C "$dest"
  elif [ -f "$SNAPSHOT/diffusion.py" ]; then
    cp -r "$SNAPSHOT"/. "$dest"/; rev="copied from $SNAPSHOT"
  else
    die "--fetch-mdlm $SNAPSHOT: neither a git directory nor a checkout of kuleshov-group/mdlm (no diffusion.py)"
  fi
  echo "$rev" > "$dest/REVISION"
  "$PY" benchmarks/gpu_check_mdlm.py --ref "$dest" --check || die "$dest lacks the reference's files"
  echo "kuleshov-group/mdlm ($rev) in $dest ($(du -sh "$dest" | cut -f1)); ignored by git, carried with .carry"
}

setup() {
  # install the carried wheels and the project against this machine's torch; record what it took
  local t0 site=/tmp/replaid-site how="pip --no-deps" wheels=() gpu="" driver=""
  t0=$(date +%s.%N)
  mkdir -p "$site"
  if command -v nvidia-smi >/dev/null 2>&1; then
    IFS=',' read -r gpu driver _ < <(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
                                     | head -1) || true
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  else
    stamp "no nvidia-smi on this machine"
  fi
  shopt -s nullglob
  wheels=("$WHEEL_DIR"/*.whl)
  shopt -u nullglob
  if [ ${#wheels[@]} -gt 0 ]; then
    stamp "installing ${#wheels[@]} carried wheel(s) from $WHEEL_DIR into $site (--no-index --no-deps)"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}" \
      || stamp "warning: the carried wheels did not all install; the steps that need them will say so"
  fi
  stamp "installing the project (--no-deps --no-build-isolation) against this machine's torch"
  if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
         --target "$site" . >/tmp/replaid-pip.log 2>&1; then
    how="PYTHONPATH=src (pip install failed: $(tail -1 /tmp/replaid-pip.log))"
    export PYTHONPATH="$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH}"
  else
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PATH="$site/bin:$PATH"
  local secs
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
  "$PY" - "$secs" "$how" "$gpu" "$driver" "${#wheels[@]}" > /tmp/replaid-setup.json <<'EOF'
import json, sys
import torch, replaid
secs, how, gpu, driver, n = sys.argv[1:]
rec = {"setup_seconds": float(secs), "project": how, "gpu": gpu.strip() or None, "driver": driver.strip() or None,
       "wheels_installed": int(n), "torch": torch.__version__, "cuda": torch.version.cuda,
       "cuda_available": torch.cuda.is_available(), "replaid": replaid.__file__}
print(json.dumps(rec))
print(f"device {rec['gpu']}, driver {rec['driver']}, torch {rec['torch']}, CUDA {rec['cuda']}, "
      f"set-up {secs} s ({how})", file=sys.stderr)
EOF
  [ -s /tmp/replaid-setup.json ] || die "the project does not import after set-up (see above); nothing was checked"
}

case "$MODE" in
  wheels) fetch_wheels; exit ;;
  mdlm) fetch_mdlm; exit ;;
  merge)
    [ ${#MERGE[@]} -gt 0 ] || die "--merge needs the gpu_check.json files of the calls to merge"
    PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" benchmarks/gpu_check.py --merge "${MERGE[@]}" \
      ${OUTDIR:+--out "$OUTDIR"} "${RECORD[@]}" ;;
  dry)
    [ ${#RECORD[@]} -eq 0 ] || die "--record goes with --merge"
    GPU_CHECK_WHEELS="${WHEELS[*]} ${SDIST_WHEELS[*]}" PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" \
      exec "$PY" benchmarks/gpu_check.py --dry-run "${QUICK[@]}" "${PASS[@]}" ;;
esac

[ ${#RECORD[@]} -eq 0 ] || die "--record goes with --merge"
"$PY" benchmarks/gpu_check.py --check-args "${QUICK[@]}" "${PASS[@]}" || exit 2  # bad input: before the set-up
OUTDIR=${OUTDIR:-${OUT:-runs/gpu_check}}
mkdir -p "$OUTDIR" || die "cannot create --out $OUTDIR"
exec > >(tee -a "$OUTDIR/gpu_check.log") 2>&1
stamp "set-up on $(hostname) with $PY ($("$PY" --version 2>&1))"
setup
"$PY" benchmarks/gpu_check.py "${QUICK[@]}" --out "$OUTDIR" --python "$PY" --setup-json /tmp/replaid-setup.json \
  "${PASS[@]}"
