#!/usr/bin/env bash
# One device call for issue 45's tensor-parallel figures on a 2-GPU machine, under 450 s: the TP tests on the GPUs
# (ENGINE_TEST_DEVICE=cuda: NCCL between the ranks), then benchmarks/gpu_tp.py (the Llama-3.1-8B shape, random bf16:
# TP=2 against TP=1, each with and without CUDA graphs; batch-1 decode, 256 x 128/128, all-reduce time per step).
#   run tool: command "bash benchmarks/gpu_tp.sh", kind nvidia-h200-x2, carry [".whl"] (wheels of the gateway's
#   dependencies that the device lacks, installed with --no-deps beside its torch/triton/transformers).
# Lands in $OUT: log.txt, nccl_destroy.txt, tests_cuda.txt, tp/ (gpu_tp.json, tp2_trace_b1.json,
# tp2_eager_trace_b1.json), tp.txt.
# PHASES picks a subset of "tests bench"; BUDGET_S (default 420, plus about 20 s of setup) bounds the phases together.
BUDGET_S=${BUDGET_S:-420}
source benchmarks/gpu_setup.sh
PHASES=${PHASES:-"tests bench"}

if [[ $PHASES == *tests* ]]; then
  stamp "NCCL's destroy with and without a live CUDA graph (the second hangs: killed at 60 s)"
  for mode in --eager "" --keep; do
    timeout -k 5 60 python -m benchmarks.nccl_graph_destroy $mode >> $OUT/nccl_destroy.txt 2>&1
    echo "rc $? mode $mode" >> $OUT/nccl_destroy.txt
  done
  grep "^rank\|^rc" $OUT/nccl_destroy.txt | tee -a "$L"
  stamp "TP tests on the GPUs (NCCL), float32 against transformers"
  cuda_tests 150 tests/unit/test_tensor_parallel.py
fi
if [[ $PHASES == *bench* ]]; then
  stamp "gpu_tp: Llama-3.1-8B shape, tp1 / tp1_eager / tp2 / tp2_eager"
  timeout "$(left 270)" python -m benchmarks.gpu_tp --out $OUT/tp > $OUT/tp.txt 2>&1
  echo "rc $?" >> $OUT/tp.txt; grep "^gpu_tp\|^rc" $OUT/tp.txt | cut -c1-800 | tee -a "$L"
fi
stamp end
