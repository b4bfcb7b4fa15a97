#!/usr/bin/env bash
# One device call for issue 44's FP8 figures, about 7 minutes on an H200: the CUDA tests of FP8 serving (the kernels
# against their float references, the FP8 checkpoints and --quantization fp8 through the engine and the HTTP server,
# LoRA and the fused kernels beside them), then benchmarks/gpu_quant.py (bf16 vs FP8 at the Llama-3.1-8B shape).
#   run tool: command "bash benchmarks/gpu_quant.sh", carry [".whl"] (wheels of the gateway's dependencies that the
#   device lacks, installed with --no-deps beside its torch/triton/transformers).
# Lands in $OUT: log.txt, tests_cuda.txt, quant/ (gpu_quant.json), quant.txt. PHASES picks a subset of "tests bench";
# BUDGET_S (default 560) bounds them together.
BUDGET_S=${BUDGET_S:-560}
source benchmarks/gpu_setup.sh
PHASES=${PHASES:-"tests bench"}

if [[ $PHASES == *tests* ]]; then
  stamp "CUDA tests: FP8 kernels and checkpoints, --quantization fp8 e2e, kernels and LoRA (ENGINE_TEST_DEVICE=cuda)"
  cuda_tests 240 tests/unit/test_fp8_kernels.py tests/unit/test_fp8.py tests/e2e/test_quantization.py \
    tests/unit/test_cuda_kernels.py tests/unit/test_cuda_lora.py
fi
if [[ $PHASES == *bench* ]]; then
  stamp "gpu_quant: Llama-3.1-8B shape, bf16 vs FP8 (kernels, batch 1 vs floor, 256 x 128/128)"
  timeout "$(left 300)" python -m benchmarks.gpu_quant --out $OUT/quant > $OUT/quant.txt 2>&1
  echo "rc $?" >> $OUT/quant.txt; grep "^gpu_quant" $OUT/quant.txt | cut -c1-1500 | tee -a "$L"
fi
stamp end
