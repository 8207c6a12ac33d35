#!/usr/bin/env bash
# Submit a rayb study to a running Ray cluster as a Ray job; stream its logs; exit 0 only if it succeeded.
#
#   RAY_ADDRESS=http://127.0.0.1:8265 jobs/submit_study.sh STUDY.yaml OUTPUT [ARCHIVE_URI] [--eval-only]
#
# OUTPUT is where everything the study writes goes, passed through as `rayb run --output`: an object-storage
# URI such as s3://bucket/prefix or gs://bucket/prefix (any pyarrow/fsspec URI), which every node reads and
# writes with its own credentials (instance role, service account, or the environment; never the study
# file), or a directory every node of the cluster shares (an NFS/EFS/Filestore mount such as /mnt/rayb/out).
# ARCHIVE_URI (s3://..., gs://..., any pyarrow URI) also gets a copy of the study's results and its trials'
# models and evaluations, for a shared-directory OUTPUT; it is not needed when OUTPUT is already on object
# storage. (Only the arguments after the first two are read as ARCHIVE_URI or --eval-only.) A sweep is a
# study with several learning rates (train.lr: [...]); the same script runs it.
# --eval-only evaluates the checkpoints the study already trained with its (new) eval suites and refuses
# to train anything (jobs/submit_eval.sh).
# RAYB_RUNTIME_ENV names another runtime-env file for the job (default jobs/runtime_env.yaml): say, one that
# adds your own environment variables, or one without working_dir where the cluster's image holds the code.
# Submitting the same study again after a failure resumes it: finished trials are kept, unfinished ones
# continue from their last checkpoint. Ctrl-C stops following the logs, not the job (`ray job stop ID`).
set -euo pipefail
usage="usage: jobs/submit_study.sh STUDY.yaml OUTPUT [ARCHIVE_URI] [--eval-only]  (OUTPUT: s3://bucket/prefix, gs://..., or a shared directory)"
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
exec ray job submit --runtime-env "${RAYB_RUNTIME_ENV:-jobs/runtime_env.yaml}" -- rayb run "$study" --output "$output" ${args[@]+"${args[@]}"}  # (bash 3.2-safe when empty)
