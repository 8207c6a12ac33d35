#!/usr/bin/env bash
# Submit a rayb study to a running Ray cluster as a Ray job; stream its logs; exit 0 only if it succeeded.
#
#   RAY_ADDRESS=http://127.0.0.1:8265 jobs/submit_study.sh STUDY.yaml OUTPUT_DIR [ARCHIVE_URI] [--eval-only]
#
# OUTPUT_DIR must be storage every node of the cluster shares (an NFS/EFS/Filestore mount such as
# /mnt/rayb/out). ARCHIVE_URI (s3://bucket/prefix, gs://bucket/prefix, any pyarrow URI) also gets a copy
# of the study's results and its trials' models and evaluations, so they outlive the cluster and its
# file system. A sweep is a study with several learning rates (train.lr: [...]); the same script runs it.
# --eval-only evaluates the checkpoints the study already trained with its (new) eval suites and refuses
# to train anything (jobs/submit_eval.sh).
# Submitting the same study again after a failure resumes it: finished trials are kept, unfinished ones
# continue from their last checkpoint. Ctrl-C stops following the logs, not the job (`ray job stop ID`).
set -euo pipefail
usage="usage: jobs/submit_study.sh STUDY.yaml OUTPUT_DIR [ARCHIVE_URI] [--eval-only]"
study=${1:?$usage}
output=${2:?$usage}
shift 2
args=()
for arg in "$@"; do
  case "$arg" in
    --eval-only) args+=(--eval-only) ;;
    *://*) args+=(--archive "$arg") ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
rayb validate "$study"  # a bad study fails here, before it reaches the cluster
exec ray job submit --runtime-env jobs/runtime_env.yaml -- rayb run "$study" --output "$output" ${args[@]+"${args[@]}"}  # (bash 3.2-safe when empty)
