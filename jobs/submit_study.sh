#!/usr/bin/env bash
# Submit a rayb study to a running Ray cluster as a Ray job; stream its logs; exit 0 only if it succeeded.
#
#   RAY_ADDRESS=http://127.0.0.1:8265 jobs/submit_study.sh STUDY.yaml OUTPUT_DIR
#
# OUTPUT_DIR must be storage every node of the cluster shares (an NFS/EFS/Filestore mount such as
# /mnt/rayb/out), so results outlive the cluster. Submitting the same study again after a failure
# resumes it: finished trials are kept, unfinished ones continue from their last checkpoint.
# Ctrl-C stops following the logs, not the job (`ray job stop ID` does that).
set -euo pipefail
study=${1:?usage: jobs/submit_study.sh STUDY.yaml OUTPUT_DIR}
output=${2:?usage: jobs/submit_study.sh STUDY.yaml OUTPUT_DIR}
cd "$(dirname "$0")/.."
rayb validate "$study"  # a bad study fails here, before it reaches the cluster
exec ray job submit --runtime-env jobs/runtime_env.yaml -- rayb run "$study" --output "$output"
