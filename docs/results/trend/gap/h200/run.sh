#!/usr/bin/env bash
# issue 34 §2 on the lent H200: the gap grid (docs/results/trend/gap.yaml) with every run on the GPU at once;
# an inner time limit, then the small files of every run (metrics, config, evaluations) go to $OUT.
set -u
LIMIT=${1:-300}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site . >/tmp/pip.log 2>&1 \
  && export PYTHONPATH=/tmp/site || export PYTHONPATH=$PWD/src
export PATH=/tmp/site/bin:$PATH OMP_NUM_THREADS=1
G=/tmp/trend-gap
python3 -m replaid grid plan docs/results/trend/gap.yaml data.source=.gl/linux-docs train.device=cuda --out $G >/dev/null || exit 3
date +%s > $OUT/start
timeout $LIMIT python3 -m replaid grid run $G --max-parallel 12 --no-progress > $OUT/grid_run.log 2>&1
echo "grid run exit $?" >> $OUT/grid_run.log
date +%s > $OUT/end
pkill -f "replaid train" ; sleep 2
# (the run of 2026-11-26 had an unquoted glob here, so its copy failed; the files came back by this tar,
# run as a second device call while the machine was still warm)
cd $G && tar -czf $OUT/tg.tgz --exclude='*/checkpoints' --exclude='*/tokenizer' --exclude='*/tb' \
  spec.json manifest.json logs configs runs
tail -5 $OUT/grid_run.log; nvidia-smi --query-gpu=utilization.gpu --format=csv
