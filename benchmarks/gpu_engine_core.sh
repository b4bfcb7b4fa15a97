#!/usr/bin/env bash
# One device call for issue 15 (engine core in its own process): gpu_bench without the transformers baselines.
#   run tool: command "bash benchmarks/gpu_engine_core.sh", carry [".whl"] (wheels of the gateway's
#   dependencies that the device lacks, installed with --no-deps beside its torch/triton/transformers).
# Lands in $OUT: log.txt, tests_cuda.txt, gpu_bench.json, profile.txt, the servers' logs. SKIP overrides the
# skipped gpu_bench phases; TESTS=0 skips the CUDA tests (async scheduling, graphs, the engine tests on CUDA);
# TEST_FILES replaces their list (TESTS_S: their time limit, default 200 s). Every phase but hf/tserve takes about
# 650 s on an H100 (2026-11-27: the engine 123 s, each HTTP phase 75-80 s, most of it the server's start), more than
# one device call's 600 s: skip the --api-servers phases in one call and run them in another.
source benchmarks/gpu_setup.sh
if [[ ${TESTS:-1} == 1 ]]; then
  ENGINE_TEST_DEVICE=cuda timeout "${TESTS_S:-200}" python -m pytest -q -p no:cacheprovider ${TEST_FILES:-tests/unit/test_cuda_kernels.py \
    tests/unit/test_cuda_graphs.py tests/unit/test_async_scheduling.py tests/unit/test_llm_engine.py} > $OUT/tests_cuda.txt 2>&1
  echo "rc $?" >> $OUT/tests_cuda.txt; tail -8 $OUT/tests_cuda.txt | tee -a "$L"
fi
python -m benchmarks.gpu_bench --out "$OUT" --skip "${SKIP:-hf,tserve}" 2>&1 | tee -a "$L" | grep -v "^\[" | tail -40
