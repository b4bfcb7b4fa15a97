#!/usr/bin/env bash
# Exports commit BASE's runtime/ benchmarks/ gateway/ adapters/ into .ab/base (ignored by git), the folder that
# benchmarks/gpu_ab.sh measures against the working tree on the device (which gets no git history):
#   bash benchmarks/ab_prepare.sh BASE        then carry [".whl", ".ab"] to `bash benchmarks/gpu_ab.sh .ab/base .`
set -euo pipefail
base=${1:?usage: ab_prepare.sh BASE (a commit)}
cd "$(git rev-parse --show-toplevel)"
rm -rf .ab/base && mkdir -p .ab/base
git archive "$base" runtime benchmarks gateway adapters | tar -x -C .ab/base
git rev-parse --short "$base" > .ab/base/COMMIT
echo "exported $(cat .ab/base/COMMIT) into .ab/base ($(du -sh .ab/base | cut -f1))"
