#!/usr/bin/env bash
# issue 34 §2 on the lent GPU: the gap grid (docs/results/trend/gap2.yaml) with every run on the GPU at once;
# an inner time limit, then the small files of every run (metrics, config, evaluations) go to $OUT.
set -u
LIMIT=${1:-420}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . >/tmp/pip.log 2>&1 \
  && export PYTHONPATH=/tmp/site || export PYTHONPATH=$PWD/src
export PATH=/tmp/site/bin:$PATH OMP_NUM_THREADS=1
G=/tmp/trend-gap2
python3 -m replaid grid plan docs/results/trend/gap2.yaml data.source=.gl/linux-docs train.device=cuda --out $G >/dev/null || exit 3
date +%s > $OUT/start
timeout $LIMIT python3 -m replaid grid run $G --max-parallel 12 --no-progress > $OUT/grid_run.log 2>&1
echo "grid run exit $?" >> $OUT/grid_run.log
date +%s > $OUT/end
pkill -f "replaid train" ; sleep 2
cd $G && find . -path './runs/*/checkpoints' -prune -o -path './runs/*/tokenizer' -prune -o -type f -size -8M -print \
  | grep -v "/tb/" | tar -czf $OUT/tg2.tgz -T -
tail -5 $OUT/grid_run.log; nvidia-smi --query-gpu=utilization.gpu --format=csv
