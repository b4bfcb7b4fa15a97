#!/usr/bin/env bash
# One device call for issue 15's speculation figure: the widened 1B target (benchmarks/gpu_models.py) with the
# demo draft, bf16, at concurrency 1, 4 and 8 under the server's default --speculative-max-concurrency, plus the
# speculative engine tests on CUDA with async scheduling.
#   run tool: command "bash benchmarks/gpu_spec_policy.sh", carry [".whl"]. Lands in $OUT: log.txt, spec_c*.json.
# CONCURRENCY overrides the concurrencies (default "1 4 8"); SPEC_TESTS=0 skips the CUDA tests; REQUESTS (requests
# per concurrency, default 8) and REPEAT (rounds of all modes, default 2) lengthen the runs; SPEC_ARGS are passed on
# to benchmarks/spec_decode.py (e.g. "--speculative-max-concurrency 4"), TAG names the JSON.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
L=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >>"$L" 2>&1
export PYTHONPATH=/tmp/site:$PWD
CK=/tmp/ck
python -c "
from pathlib import Path; import torch
from benchmarks import gpu_models as g
g.widen_checkpoint(Path('runtime/demo/model'), Path('$CK/wide1b'), dtype=torch.bfloat16)" > $OUT/ckpt.txt 2>&1 &
CKPID=$!
if [[ ${SPEC_TESTS:-1} == 1 ]]; then
  ENGINE_TEST_DEVICE=cuda timeout 120 python -m pytest -q -p no:cacheprovider tests/unit/test_spec_engine.py \
    > $OUT/tests_spec_cuda.txt 2>&1; echo "rc $?" >> $OUT/tests_spec_cuda.txt; tail -3 $OUT/tests_spec_cuda.txt | tee -a "$L"
fi
wait $CKPID
for c in ${CONCURRENCY:-1 4 8}; do
  per=$(( ${REQUESTS:-8} / c ))
  timeout 400 python -m benchmarks.spec_decode --model $CK/wide1b --draft-model runtime/demo/draft --device cuda \
    --dtype bfloat16 --max-tokens 128 --concurrency $c --requests-per-slot $per --repeat ${REPEAT:-2} ${SPEC_ARGS:-} \
    --json $OUT/spec${TAG:-}_c$c.json 2>&1 | grep -v "Loading\|Writing" | tail -5 | tee -a "$L"
done
