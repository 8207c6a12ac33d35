#!/usr/bin/env bash
# Evaluate the checkpoints a study already trained, as a Ray job, without training anything:
#
#   RAY_ADDRESS=http://127.0.0.1:8265 jobs/submit_eval.sh STUDY.yaml OUTPUT_DIR [ARCHIVE_URI]
#
# Add suites to the study's `eval` list (or change `eval_options`) and submit: each (checkpoint × suite)
# without a result runs on the eval actors, and the report is rebuilt. If any trial of the study has no
# finished training (a changed model or seed, say), the job fails before any work, naming them.
set -euo pipefail
exec "$(dirname "$0")/submit_study.sh" "$@" --eval-only
