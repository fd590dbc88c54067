#!/bin/bash
# Submit an evaluation as SHARDS array tasks, and its merge once every task has succeeded:
#
#   RUN=/shared/runs/test SHARDS=8 CONFIG=eval.toml docs/examples/slurm/submit.sh [EVAL FLAGS...]
#
# RUN, CONFIG, CORPUS and EXPLORER are eval-array.sbatch's settings; EVAL FLAGS go to every task's
# `explorer eval`. If a task fails, the merge is cancelled (the task's log names what was refused).
set -euo pipefail

if [[ -z ${RUN:-} || ! ${SHARDS:-} =~ ^[1-9][0-9]*$ ]]; then
    echo "error: export RUN (the directory the shards and the merged run go under, shared by every node)" \
        "and SHARDS (how many array tasks, one shard each), e.g. RUN=/shared/runs/test SHARDS=8 $0" >&2
    exit 2
fi
here=$(dirname "$0")
mkdir -p "$RUN"
RUN=$(CDPATH="" cd -- "$RUN" && pwd) # absolute, so the jobs' logs name it whole
export RUN

array=$(sbatch --parsable --array="1-$SHARDS" --export=ALL "$here/eval-array.sbatch" "$@")
array=${array%%;*} # --parsable prints JOBID or JOBID;CLUSTER
merge=$(sbatch --parsable --dependency="afterok:$array" --kill-on-invalid-dep=yes --export=ALL "$here/merge.sbatch")
echo "array job $array: $SHARDS shards into $RUN; merge job ${merge%%;*}: into $RUN/merged"
