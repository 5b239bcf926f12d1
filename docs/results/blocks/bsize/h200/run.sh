#!/usr/bin/env bash
# issue 39 §4 on the lent GPU: the block-size grid (docs/results/blocks/bsize.yaml) with every run on the GPU at once;
# an inner time limit, then the small files of every run (metrics, config, evaluations) go to $OUT.
set -u
LIMIT=${1:-420}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . >/tmp/pip.log 2>&1 \
  && export PYTHONPATH=/tmp/site || export PYTHONPATH=$PWD/src
export PATH=/tmp/site/bin:$PATH OMP_NUM_THREADS=1
G=/tmp/blocks-bsize
python3 -m replaid grid plan docs/results/blocks/bsize.yaml data.source=.gl/linux-docs train.device=cuda --out $G >/dev/null || exit 3
date +%s > $OUT/start
timeout $LIMIT python3 -m replaid grid run $G --max-parallel 12 --no-progress > $OUT/grid_run.log 2>&1
echo "grid run exit $?" >> $OUT/grid_run.log
date +%s > $OUT/end
pkill -f "replaid train" ; sleep 2
cd $G && find . -path './runs/*/checkpoints' -prune -o -path './runs/*/tokenizer' -prune -o -type f -size -8M -print \
  | grep -v "/tb/" | tar -czf $OUT/bsize.tgz -T -
for r in replaid-b16__s0 mdlm-b16__s0; do
  S=$(cat runs/$r/checkpoints/LATEST)
  tar -czf $OUT/ck-$r.tgz runs/$r/config.json runs/$r/tokenizer runs/$r/checkpoints/LATEST runs/$r/checkpoints/$S/model.safetensors runs/$r/checkpoints/$S/ema.safetensors runs/$r/checkpoints/$S/state.json runs/$r/checkpoints/$S/optimizer.json
done
ls -la $OUT
tail -5 $OUT/grid_run.log; nvidia-smi --query-gpu=utilization.gpu --format=csv
