#!/usr/bin/env bash
# Installs rayb, and the exact package set its test suite passed on (rayb/constraints.txt), into the
# Python on PATH (an active virtual environment's, if any). `bash install.sh dev` adds the suite's own
# packages and the headless Chromium that its report test opens.
#
# pip installs torch first: on a CPU machine a local CPU wheel of torch==2.13.0 exists, which only pip
# looks for (an open range, or uv, pulls gigabytes of CUDA packages); on a GPU machine the torch build
# already there stays. uv installs the rest from the same constraints: the same packages as pip, compiled
# to bytecode as pip does, in under half its time (2 cores, 2026-12-04: 46 s from an empty cache, against
# pip's 104 s from a full one).
set -euo pipefail
cd "$(dirname "$0")"
case "${1:-}" in
  "") extras="" ;;
  # Chromium's install (19 s on 2 cores, mostly unpacking) runs beside pip's and uv's, which leave a core free.
  dev) extras="[dev]"; bash tests/install_chromium.sh & ;;
  *) echo "usage: bash install.sh [dev]" >&2; exit 2 ;;
esac
# pip compiles what it installs one file at a time (torch and its dependencies: 21 s of one core of 2,
# 2026-12-07). A pip that reports what it installed (--report, pip 22.2 on) leaves that here, where it is
# compiled on every core while uv downloads.
report=$(mktemp)
trap 'rm -f "$report"' EXIT
uncompiled=(--no-compile --report "$report")
[[ $(python -m pip install --help) == *--report* ]] || uncompiled=()
python -m pip install ${uncompiled[@]+"${uncompiled[@]}"} -c rayb/constraints.txt torch==2.13.0 uv
python - "$report" <<'PY' &
import compileall, importlib.metadata, json, pathlib, sys

report = pathlib.Path(sys.argv[1]).read_text()
for item in json.loads(report)["install"] if report else []:
    dist = importlib.metadata.distribution(item["metadata"]["name"])
    for top in sorted({f.parts[0] for f in dist.files or [] if f.suffix == ".py" and f.parts[0] != ".."}):
        path = dist.locate_file(top)  # a package's directory, or a module of one file
        compileall.compile_dir(path, quiet=2, workers=0) if path.is_dir() else compileall.compile_file(path, quiet=2)
PY
python -m uv pip install --python "$(python -c 'import sys; print(sys.executable)')" --compile-bytecode \
  -c rayb/constraints.txt -e ".$extras"
# pyenv makes the shims for new commands (rayb, ray) after a pip install only: uv's need a rehash.
if command -v pyenv >/dev/null; then pyenv rehash; fi
wait  # for Chromium's install and the bytecode of pip's packages
