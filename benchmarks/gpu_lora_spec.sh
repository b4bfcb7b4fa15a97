#!/usr/bin/env bash
# One device call for issues 6 (LoRA) and 7 (speculative decoding): CUDA tests, then the benchmarks.
#   run tool: command "bash benchmarks/gpu_lora_spec.sh", carry [".whl"] (wheels of the gateway's pure-Python
#   dependencies, installed with --no-deps beside the device's torch/triton/transformers).
# Everything lands in $OUT as it goes (log.txt, *.json, tests*.txt); PHASES picks a subset.
set -u
PHASES=${PHASES:-"tests lora kernels spec ksweep"}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
L=$OUT/log.txt; T0=$(date +%s)
stamp() { echo "=== $(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*" | tee -a "$L"; }
stamp start
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >>"$L" 2>&1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >>"$L" 2>&1
python -c "import torch,triton,transformers;print('torch',torch.__version__,'triton',triton.__version__,'transformers',transformers.__version__)" >>"$L" 2>&1
CK=/tmp/ck
mkdir -p $CK
stamp "building the widened 1B target in the background"
python -c "
from pathlib import Path; import torch, time
from benchmarks import gpu_models as g
t=time.time(); g.widen_checkpoint(Path('runtime/demo/model'), Path('$CK/wide1b'), dtype=torch.bfloat16); print('widen s', time.time()-t)
" > $OUT/ckpt.txt 2>&1 &
CKPID=$!

if [[ $PHASES == *tests* ]]; then
  stamp "CUDA tests: kernels, graphs, LoRA kernels, and the engine tests on CUDA (ENGINE_TEST_DEVICE=cuda)"
  timeout 100 python -m pytest -q -x -p no:cacheprovider tests/unit/test_cuda_kernels.py tests/unit/test_cuda_graphs.py \
    tests/unit/test_cuda_lora.py > $OUT/tests_kernels.txt 2>&1; echo "rc $?" >> $OUT/tests_kernels.txt
  tail -3 $OUT/tests_kernels.txt | tee -a "$L"
  ENGINE_TESTS=${ENGINE_TESTS:-"tests/unit/test_lora_engine.py tests/unit/test_spec_engine.py tests/unit/test_spec_sampling.py tests/unit/test_llm_engine.py"}
  ENGINE_TEST_DEVICE=cuda timeout 240 python -m pytest -q -p no:cacheprovider $ENGINE_TESTS > $OUT/tests_engine_cuda.txt 2>&1
  echo "rc $?" >> $OUT/tests_engine_cuda.txt; tail -15 $OUT/tests_engine_cuda.txt | tee -a "$L"
fi
if [[ $PHASES == *lora* ]]; then
  stamp lora
  timeout 90 python -m benchmarks.lora_step --synthetic 1b --device cuda --graph --iters 20 --warmup 3 \
    --json $OUT/lora.json 2>&1 | grep -v Writing | tee -a "$L"
  timeout 60 python -m benchmarks.lora_step --synthetic 1b --device cuda --batch 8 --iters 10 --warmup 3 --profile \
    > $OUT/lora_profile.txt 2>&1
  stamp "lora, slots sized for rank 64 (the default --max-lora-rank), rank-8 adapters"
  timeout 90 python -m benchmarks.lora_step --synthetic 1b --device cuda --max-lora-rank 64 --iters 20 --warmup 3 \
    --prefill 0 --json $OUT/lora_cap64.json 2>&1 | grep -v Writing | tee -a "$L"
fi
if [[ $PHASES == *prefill* ]]; then
  for et in 64 4096; do  # the masked all-slots product (what long steps run) vs the expand kernel for every size
    stamp "lora prefill, expand kernel up to $et tokens"
    timeout 60 python -c "import sys, runtime.native.lora.apply as a; a.EXPAND_TOKENS = $et
from benchmarks.lora_step import main; main(sys.argv[1:])" --synthetic 1b --device cuda --batch 8 --iters 10 \
      --warmup 3 --json $OUT/lora_prefill_$et.json 2>&1 | grep -v "Writing\|Loading" | tail -3 | tee -a "$L"
  done
fi
if [[ $PHASES == *kernels* ]]; then
  stamp "LoRA kernels micro-benchmark (64 Linears of the 1B, graphed)"
  timeout 120 python -m benchmarks.lora_kernels_bench --json $OUT/lora_kernels.json 2>&1 | tee -a "$L"
fi
wait $CKPID; echo "ckpt rc $?" >> $OUT/ckpt.txt; tail -2 $OUT/ckpt.txt | tee -a "$L"
if [[ $PHASES == *spec* ]]; then
  # c=1: all 8 prompts one after another, 3 paired rounds; c=8: the 8 prompts at once
  for dt in float32 bfloat16; do
    stamp "spec demo pair $dt"
    timeout 100 python -m benchmarks.spec_decode --device cuda --dtype $dt --max-tokens 128 --concurrency 1 \
      --requests-per-slot 8 --repeat 3 --json $OUT/spec_demo_$dt.json 2>&1 | grep -v Loading | tail -5 | tee -a "$L"
  done
  for dt in bfloat16 float32; do
    stamp "spec widened 1B $dt, c=1"
    timeout 150 python -m benchmarks.spec_decode --model $CK/wide1b --draft-model runtime/demo/draft --device cuda \
      --dtype $dt --max-tokens 128 --concurrency 1 --requests-per-slot 8 --repeat 3 \
      --json $OUT/spec_wide1b_c1_$dt.json 2>&1 | grep -v Loading | tail -5 | tee -a "$L"
  done
  stamp "spec widened 1B bf16, c=8"
  timeout 100 python -m benchmarks.spec_decode --model $CK/wide1b --draft-model runtime/demo/draft --device cuda \
    --dtype bfloat16 --max-tokens 128 --concurrency 8 --requests-per-slot 1 --repeat 3 \
    --json $OUT/spec_wide1b_c8.json 2>&1 | grep -v Loading | tail -5 | tee -a "$L"
fi
if [[ $PHASES == *ksweep* ]]; then
  for k in 2 3 6; do
    stamp "spec widened 1B bf16, c=1, K=$k"
    timeout 100 python -m benchmarks.spec_decode --model $CK/wide1b --draft-model runtime/demo/draft --device cuda \
      --dtype bfloat16 --max-tokens 128 --concurrency 1 --requests-per-slot 8 --repeat 2 --num-draft-tokens $k \
      --json $OUT/spec_wide1b_c1_k$k.json 2>&1 | grep -v Loading | tail -4 | tee -a "$L"
  done
fi
stamp end
