#!/usr/bin/env bash
# One device call for issue 48 (about 8 minutes on an H200): the CUDA tests named in TESTS, then
# benchmarks/gpu_load_profile.py at the 8B and 1B shapes (the steps' split, GPU time by kernel kind and the gaps, TTFT
# vs its FLOP floor, ITL at 64 and 256 streams, 256 x 128/128 timed at each of MAX_NUM_TOKENS; the 8B's 512-stream
# 1k/256 mix; the 1B through the engine core in its own process), then the decode-attention kernel's tiles at 256
# rows (benchmarks/cuda_decode_attention.py, head sizes 128 and 64), then the 8B's GEMMs by row count
# (benchmarks/gemm_shapes.py: cuBLAS, gate/up in halves, Inductor's autotuned Triton GEMMs). MIX_KV="auto,fp8" runs
# the mix with both KV cache dtypes; MIX_SHAPES= and CORE_SHAPES= (empty) leave the mix and the core phase out.
#   run tool: command "bash benchmarks/gpu_load.sh", carry [".whl"]
# Lands in $OUT: log.txt, tests_cuda.txt, load/gpu_load_profile.json, load.txt, attention.txt. PHASES picks from
# "tests profile attention gemm".
BUDGET_S=${BUDGET_S:-560}
source benchmarks/gpu_setup.sh
PHASES=${PHASES:-"tests profile attention gemm"}
MIX_KV=${MIX_KV:-auto}
TESTS=${TESTS:-"tests/unit/test_cuda_kernels.py tests/unit/test_cuda_graphs.py tests/unit/test_cuda_families.py \
tests/unit/test_model_families.py tests/unit/test_llm_engine.py tests/unit/test_spec_engine.py"}
MAX_NUM_TOKENS=${MAX_NUM_TOKENS:-"default"}  # "default": the engine's choice for each shape
SHAPES=${SHAPES:-"llama-3.1-8b,llama-3.2-1b"}

if [[ $PHASES == *tests* ]]; then
  stamp "CUDA tests: $TESTS"
  # shellcheck disable=SC2086
  cuda_tests 170 $TESTS
fi
if [[ $PHASES == *profile* ]]; then
  stamp "gpu_load_profile: $SHAPES, max_num_tokens $MAX_NUM_TOKENS"
  timeout "$(left 330)" python -m benchmarks.gpu_load_profile --out $OUT/load --work /tmp/load --shapes "$SHAPES" \
    --max-num-tokens "$MAX_NUM_TOKENS" --mix-kv-dtypes "$MIX_KV" --mix-shapes "${MIX_SHAPES-llama-3.1-8b}" \
    --core-shapes "${CORE_SHAPES-llama-3.2-1b}" > $OUT/load.txt 2>&1
  echo "rc $?" >> $OUT/load.txt; grep "^gpu_load_profile" $OUT/load.txt | cut -c1-600 | tee -a "$L"
fi
if [[ $PHASES == *attention* ]]; then
  stamp "cuda_decode_attention: 256 rows, head sizes 128 and 64"
  for d in 128 64; do
    timeout "$(left 60)" python -m benchmarks.cuda_decode_attention --rows 256 --contexts 192,1024 --block-n 32,64,128 \
      --num-warps 2,4,8 --head-dim $d >> $OUT/attention.txt 2>&1
  done
  tail -40 $OUT/attention.txt | tee -a "$L"
fi
if [[ $PHASES == *gemm* ]]; then
  stamp "gemm_shapes: the 8B's projections at 256, 1024 and 4096 rows"
  timeout "$(left 150)" python -m benchmarks.gemm_shapes > $OUT/gemm.txt 2>&1
  grep "^{" $OUT/gemm.txt | tee -a "$L"
fi
stamp end
