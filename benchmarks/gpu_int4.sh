#!/usr/bin/env bash
# One device call for issue 44's INT4 GEMV (about 5 minutes on an H200): the CUDA tests of the INT4 kernels (the GEMV
# against the float reference; the INT4 checkpoints through the engine; the MoE kernels that share the split-K
# counters), then benchmarks/gpu_quant.py's int4_gemv phase (tiles per Llama-3.1-8B projection against the
# weight-bytes floor, PDL launches in one CUDA graph) and its int4 engine phase
# (graphed batch-1 step with each shape's fastest GEMV, and 256 x 128/128).
#   run tool: command "bash benchmarks/gpu_int4.sh", carry [".whl"] (wheels of the gateway's dependencies that the
#   device lacks, installed with --no-deps beside its torch/triton/transformers).
# Lands in $OUT: log.txt (the GEMV table), tests_cuda.txt, quant/ (gpu_quant.json), quant.txt. PHASES picks a subset
# of "tests bench"; BUDGET_S (default 380) bounds them together (PHASES=bench: the benchmark alone, under 300 s: ten
# GEMV tiles a shape, fma against PAIRS 1 and 2).
BUDGET_S=${BUDGET_S:-380}
source benchmarks/gpu_setup.sh
PHASES=${PHASES:-"tests bench"}

if [[ $PHASES == *tests* ]]; then
  stamp "CUDA tests: INT4 kernels and checkpoints, MoE kernels (ENGINE_TEST_DEVICE=cuda)"
  cuda_tests 150 tests/unit/test_int4_kernels.py tests/unit/test_int4.py tests/unit/test_cuda_moe.py
fi
if [[ $PHASES == *bench* ]]; then
  stamp "gpu_quant int4_gemv + int4: Llama-3.1-8B shape, INT4 GEMV tiles vs floor, batch-1 step"
  timeout "$(left 300)" python -m benchmarks.gpu_quant --out $OUT/quant --skip kernels,bf16,fp8,kv_fp8 \
    > $OUT/quant.txt 2>&1
  echo "rc $?" >> $OUT/quant.txt
  grep "^|\|^rc" $OUT/quant.txt | tee -a "$L"
  grep "^gpu_quant: \(int4 \|int4_gemv_shapes\|bandwidth\)" $OUT/quant.txt | cut -c1-600 | tee -a "$L"
fi
stamp end
