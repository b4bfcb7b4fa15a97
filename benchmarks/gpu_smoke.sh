#!/usr/bin/env bash
# Every CUDA-only benchmark path once, on tiny shapes and few iterations, in one device call under 400 s on an H200
# (issue 46): each entry only proves that its CUDA code still runs (the CPU smoke tests of tests/benchmarks do not
# reach CUDA graphs, the Triton kernels on the device, or the device timing); its figures mean nothing.
#   run tool: command "bash benchmarks/gpu_smoke.sh", carry [".whl"] (as benchmarks/gpu_engine_core.sh)
#   bash benchmarks/gpu_smoke.sh --list    # the entries (name, time limit in s, command); needs no GPU
# Lands in $OUT/smoke: <name>.txt (each entry's output), summary.txt ("PASS name 12.3s" / "FAIL name rc=N" a line),
# and $OUT/log.txt (the GPU, the wheels' install). Exits 1 when an entry failed. ONLY="name ..." runs a subset;
# BUDGET_S (default 385) bounds the whole run: an entry's limit is its own or what is left, the smaller.
# The entries' own result folders go to /tmp/gpu_smoke (not brought back).
# Measured on an H200 (2026-11-28, seconds, each with a Python start, CUDA init and first Triton compiles):
# lora_step 35, lora_kernels 8, gemv_kernels 8, decode_attention 7, decode_b1 38, spec_decode 24, gpu_families 35,
# gpu_moe_profile 20; http_vs_core ran past its 60 s. Guesses: decode_b1_timers 20, gpu_quant 40, gpu_bench 100.
# gpu_load_profile, prefill_attention and gemm_shapes (issue 48) ran at full size on 2026-11-29, not yet as these entries.
# Not entries: benchmarks/gpu_models.py (a library: gpu_bench, decode_b1 and http_vs_core run it), cuda_timing.py
# (a library: every entry that times on the GPU runs it), nccl_graph_destroy.py and gpu_tp.py (two GPUs:
# benchmarks/gpu_tp.sh runs them), and the other gpu_*.sh scripts, which are these modules
# at real shapes (no quick mode) plus the CUDA test files.
W=/tmp/gpu_smoke
ENTRIES=(
  "lora_step 45 python -m benchmarks.lora_step --synthetic tiny --device cuda --graph --batch 2 4 --context 32 --prefill 64 --warmup 1 --iters 3"
  "lora_kernels 30 python -m benchmarks.lora_kernels_bench --device cuda --smoke --tokens 8 --caps 8"
  "gemv_kernels 40 python -m benchmarks.gemv_kernels --smoke --block-n 8 --block-k 256 --num-warps 4 --pdl false,true"
  "decode_attention 30 python -m benchmarks.cuda_decode_attention --smoke --rows 1,8 --contexts 129 --block-n 64 --num-warps 4 --calls 5"
  "decode_b1 40 python -m benchmarks.decode_b1 --smoke"
  "decode_b1_timers 40 python -m benchmarks.decode_b1 --smoke --timers"
  "eagle_chain_cost 40 python -m benchmarks.eagle_chain_cost --smoke --device cuda --lengths 100 700 --drafts 2 --calls 5 --work $W/models --out $W/eagle_chain"
  "few_token_step 40 python -m benchmarks.few_token_step --shape tiny --rows 1 3 --out $W/few_token_step --work $W/models"
  "spec_decode 50 python -m benchmarks.spec_decode --device cuda --max-tokens 16 --concurrency 1 4 --requests-per-slot 1"
  "fp8_quality 40 python -m benchmarks.fp8_quality --device cuda --model demo --text-tokens 128 --window 64"
  "gpu_families 60 python -m benchmarks.gpu_families --smoke --device cuda --out $W/families"
  "gpu_moe_profile 60 python -m benchmarks.gpu_moe_profile --smoke --device cuda --steps 5 --profile-steps 1 --out $W/moe_profile"
  "gpu_quant 60 python -m benchmarks.gpu_quant --smoke --device cuda --out $W/quant"
  "step_timeline 40 python -m benchmarks.step_timeline --smoke --device cuda --steps 5 --out $W/step_timeline"
  "step_timeline_int4 40 python -m benchmarks.step_timeline --smoke --device cuda --quantization int4 --out $W/tl_int4"
  "http_vs_core 60 python -m benchmarks.http_vs_core --smoke --device cuda --rounds 1 --streams 4 --out $W/http_vs_core --work $W/models"
  "gpu_load_profile 60 python -m benchmarks.gpu_load_profile --smoke --device cuda --shapes llama-3.1-8b --mix-shapes llama-3.1-8b --core-shapes llama-3.1-8b --out $W/load"
  "prefill_attention 40 python -m benchmarks.cuda_prefill_attention --smoke --block-m 64,128 --num-warps 4 --num-stages 2 --calls 5"
  "gemm_shapes 60 python -m benchmarks.gemm_shapes --smoke"
  "gpu_bench 130 python -m benchmarks.gpu_bench --smoke --device cuda --skip tserve,http_batch,http_api2,http_api4,http_batch_api2,http_batch_api4,http_batch_dp2 --out $W/gpu_bench --work $W/models"
)
if [[ ${1:-} == --list ]]; then
  printf '%s\n' "${ENTRIES[@]}"
  exit 0
fi

T0=$EPOCHREALTIME
source benchmarks/gpu_setup.sh
S=$OUT/smoke
mkdir -p "$S" "$W"
python -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" >>"$L" 2>&1
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
failed=0
for entry in "${ENTRIES[@]}"; do
  read -r name limit command <<<"$entry"
  [[ -n ${ONLY:-} && " $ONLY " != *" $name "* ]] && continue
  left=$(awk -v spent="$(since "$T0")" -v budget="${BUDGET_S:-385}" -v own="$limit" \
    'BEGIN { r = int(budget - spent); print (r < own ? r : own) }')
  if (( left < 1 )); then
    line="FAIL $name rc=none (BUDGET_S spent before it started)"
  else
    start=$EPOCHREALTIME
    echo "+ $command" > "$S/$name.txt"
    # timeout signals the entry's whole process group: servers and engine cores it started end with it
    timeout -k 5 "$left" $command >>"$S/$name.txt" 2>&1
    rc=$?
    if (( rc == 0 )); then line="PASS $name $(since "$start")s"
    elif (( rc == 124 || rc == 137 )); then line="FAIL $name rc=$rc (timed out after ${left}s)"
    else line="FAIL $name rc=$rc $(since "$start")s"
    fi
  fi
  [[ $line == FAIL* ]] && failed=1
  echo "$line" | tee -a "$S/summary.txt" "$L"
done
echo "total $(since "$T0")s" | tee -a "$S/summary.txt" "$L"
exit $failed
