#!/usr/bin/env bash
# A/B of two trees of the gateway on the GPU in ONE device call, under 550 s: gpu_bench's headline figures
# (decode at batch 1, TTFT of 1024 tokens, 256 x 128/128 in-process and through the engine core process, HTTP at
# 256 streams against the core's 256 closed-loop streams) for each side, as one table (benchmarks/ab_table.py).
#
#   here:    bash benchmarks/ab_prepare.sh BASE          # BASE's runtime/ benchmarks/ gateway/ adapters/ -> .ab/base
#   device:  run tool: command "bash benchmarks/gpu_ab.sh .ab/base .", carry [".whl", ".ab"]
#   CPU:     SMOKE=1 OUT=/tmp/ab bash benchmarks/gpu_ab.sh .ab/base .     # the tiny shape, proves the script runs
#
# Each side runs its OWN benchmarks/gpu_bench.py against its own runtime (cd into its folder, PYTHONPATH on it), on
# one shared random checkpoint. The parts alternate, base-new-new-base (the engine phase, then the HTTP phase), so
# that a drift of the machine's clocks or temperature falls on both sides alike. Lands in $OUT: log.txt, the table
# (ab_table.md), and per side and part gpu_bench.json and the servers' logs. BUDGET_S (default 545) bounds the
# whole run: a part gets at most its cap (ENGINE_S 200, HTTP_S 130) and what is left; one cut short leaves its rows
# empty in the table.
# Figures on an H100 (2026-11-27): the engine phase about 120 s, an HTTP phase 75-80 s (most of it the server's
# start); so 4 parts take about 420 s plus the checkpoint's creation.
set -u
base_dir=$(cd "${1:?usage: gpu_ab.sh BASE_FOLDER NEW_FOLDER}" && pwd)
new_dir=$(cd "${2:?usage: gpu_ab.sh BASE_FOLDER NEW_FOLDER}" && pwd)
budget=${BUDGET_S:-545}
OUT=${OUT:-/tmp/gpu_ab}
mkdir -p "$OUT"
if [[ -d .whl ]]; then
  source benchmarks/gpu_setup.sh  # the dependencies the device lacks, into /tmp/site; L = $OUT/log.txt
else
  L=$OUT/log.txt
fi
site=$([[ -d /tmp/site ]] && echo /tmp/site: || true)
flags=()
if [[ ${SMOKE:-0} == 1 ]]; then  # as the tests run: eager CPU steps (compiling them takes minutes here)
  flags=(--device cpu --smoke)
  export TRTLLM_GATEWAY_CPU_COMPILE=false
fi
all=bandwidth,logits,greedy_fp32,hf,engine,profile,http,http_batch,http_api2,http_api4,http_batch_api2,http_batch_api4,http_batch_dp2,http_in_process,tserve
echo "A/B: base $(cat "$base_dir/COMMIT" 2>/dev/null || echo "$base_dir") vs new $(cat "$new_dir/COMMIT" 2>/dev/null || git -C "$new_dir" rev-parse --short HEAD 2>/dev/null || echo "$new_dir")" | tee -a "$L"

part() {  # part SIDE DIR PHASE CAP_S: gpu_bench's PHASE alone, from DIR's tree
  local side=$1 dir=$2 phase=$3 cap=$4
  local left=$((budget - SECONDS - 5)) skip
  skip=$(tr , '\n' <<< "$all" | grep -vx "$phase" | paste -sd,)
  if (( left < 30 )); then echo "[$side $phase] not run: ${left} s left of ${budget}" | tee -a "$L"; return; fi
  echo "[$side $phase] start at ${SECONDS} s, at most $((cap < left ? cap : left)) s" | tee -a "$L"
  (cd "$dir" && PYTHONPATH="$site$dir" timeout $((cap < left ? cap : left)) python -m benchmarks.gpu_bench \
      --out "$OUT/$side-$phase" --work "${WORK:-/tmp/gpu_ab_models}" --skip "$skip" "${flags[@]}") \
    > "$OUT/$side-$phase.txt" 2>&1
  echo "[$side $phase] rc $? at ${SECONDS} s" | tee -a "$L"
}

engine_s=${ENGINE_S:-200} http_s=${HTTP_S:-130}  # each part's cap
part base "$base_dir" engine "$engine_s"
part new "$new_dir" engine "$engine_s"
part new "$new_dir" http_batch "$http_s"
part base "$base_dir" http_batch "$http_s"
(cd "$new_dir" && PYTHONPATH="$site$new_dir" python -m benchmarks.ab_table "$OUT" base new) | tee "$OUT/ab_table.md" | tee -a "$L"
