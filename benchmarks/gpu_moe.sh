#!/usr/bin/env bash
# One device call for issue 43's MoE figures, under 9 minutes on an H200 with BUDGET_S <= 500 (about 30 s of setup):
# the CUDA tests of the new families, then gpu_families' engine figures (batch 1 vs the floor, 256 x 128/128) for
# Qwen3-8B and Qwen3-30B-A3B, then benchmarks/gpu_moe_profile.py (the 30B-A3B shape's batch-1 step taken apart),
# then the GEMV tile sweep of the shapes not swept yet, in what time is left.
#   run tool: command "bash benchmarks/gpu_moe.sh", carry [".whl"] (wheels of the gateway's dependencies that the
#   device lacks, installed with --no-deps beside its torch/triton/transformers).
# Lands in $OUT: log.txt, tests_cuda.txt, families/ (gpu_families.json), profile/ (gpu_moe_profile.json),
# profile.txt, gemv.txt. PHASES picks a subset of "tests families profile gemv"; BUDGET_S (default 490) bounds the
# phases together: each one's time limit is its own or what is left of the budget, the smaller.
BUDGET_S=${BUDGET_S:-490}
source benchmarks/gpu_setup.sh
PHASES=${PHASES:-"tests families profile gemv"}

if [[ $PHASES == *tests* ]]; then
  stamp "CUDA tests: kernels, MoE kernels, family layers, families through the engine (ENGINE_TEST_DEVICE=cuda)"
  cuda_tests 230 tests/unit/test_cuda_kernels.py tests/unit/test_cuda_moe.py tests/unit/test_cuda_families.py \
    tests/unit/test_model_families.py
fi
if [[ $PHASES == *families* ]]; then
  stamp "gpu_families: Qwen3-8B and Qwen3-30B-A3B, engine figures (no transformers baseline)"
  timeout "$(left 100)" python -m benchmarks.gpu_families --out $OUT/families --shapes qwen3-8b,qwen3-30b-a3b \
    --skip hf 2>&1 | grep "^gpu_families" | cut -c1-400 | tee -a "$L"
fi
if [[ $PHASES == *profile* ]]; then
  stamp "gpu_moe_profile"
  timeout "$(left 160)" python -m benchmarks.gpu_moe_profile --out $OUT/profile > $OUT/profile.txt 2>&1
  echo "rc $?" >> $OUT/profile.txt; grep -v "Loading\|Writing" $OUT/profile.txt | cut -c1-2000 | tee -a "$L"
fi
if [[ $PHASES == *gemv* ]]; then
  stamp "gemv tiles of the shapes not swept yet (PDL launches)"
  timeout "$(left 120)" python -m benchmarks.gemv_kernels --pdl true --peak-gbs 4800 --block-n 2,4,8,16 \
    --block-k 1024,2048 --num-warps 4,8 --shapes q30b_router,q8b_down,q8b_lm_head \
    > $OUT/gemv.txt 2>&1
  echo "rc $?" >> $OUT/gemv.txt; tail -2 $OUT/gemv.txt | tee -a "$L"
fi
stamp end
