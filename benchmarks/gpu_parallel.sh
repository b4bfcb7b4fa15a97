#!/usr/bin/env bash
# Issue 45's data-parallel figure on the 2-GPU machine, one device call: gpu_bench's 256 x 128/128 over HTTP
# against one engine core (http_batch) and against two (http_batch_dp2: --data-parallel-size 2, a GPU each), on
# gpu_bench's 1B shape. The tensor-parallel figures are benchmarks/gpu_tp.sh's.
#   device (kind nvidia-h200-x2): run tool, command "bash benchmarks/gpu_parallel.sh", carry [".whl"]
#   CPU:    SMOKE=1 OUT=/tmp/dp bash benchmarks/gpu_parallel.sh       # tiny shape, the two cores alone, on the CPU
set -u
OUT=${OUT:-/tmp/gpu_parallel}
BUDGET_S=${BUDGET_S:-400}
mkdir -p "$OUT"
if [[ -d .whl ]]; then source benchmarks/gpu_setup.sh; else L=$OUT/log.txt; fi
flags=()
skip=logits,greedy_fp32,hf,engine,profile,http,http_api2,http_api4,http_batch_api2,http_batch_api4,http_in_process,tserve
# SMOKE: the tiny shape on the CPU, the two-core phase alone (one core's http_batch runs the same phase code with one
# flag fewer, and starts one more server); the ratio line then reads None
[[ ${SMOKE:-0} == 1 ]] && flags=(--device cpu --smoke) && skip+=,bandwidth,http_batch
timeout "$BUDGET_S" python -m benchmarks.gpu_bench --skip "$skip" --out "$OUT/bench" --work "${WORK:-/tmp/gpu_parallel_models}" \
  "${flags[@]}" > "$OUT/bench.txt" 2>&1
echo "gpu_bench rc $?" | tee -a "$L"
python - "$OUT/bench/gpu_bench.json" <<'PY' | tee -a "$L"
import json, sys
r = json.load(open(sys.argv[1]))
one, two = (r.get(k, {}).get("summary", {}).get("output_token_throughput") for k in ("http_batch", "http_batch_dp2"))
print(f"HTTP 256 x 128/128: one core {one} tok/s, two cores {two} tok/s, ratio {two / one if one and two else None}")
PY
