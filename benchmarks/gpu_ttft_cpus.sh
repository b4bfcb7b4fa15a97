#!/usr/bin/env bash
# One device call for issue 15: does a process's TTFT depend on the CPUs it runs on? The engine's TTFT of a
# 1,024-token prompt (gpu_bench's engine phase, latency figures only) in fresh processes, each pinned with taskset
# to one pair of CPUs (CPUS, default every consecutive pair), after the CPU topology (lscpu -e: SMT siblings).
#   run tool: command "bash benchmarks/gpu_ttft_cpus.sh", carry [".whl"] (as benchmarks/gpu_engine_core.sh)
# Lands in $OUT: log.txt, one line per run.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
L=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >>"$L" 2>&1
export PYTHONPATH=/tmp/site:$PWD
lscpu -e >>"$L" 2>&1
n=$(nproc)
skip=bandwidth,logits,greedy_fp32,hf,http,http_api2,http_api4,http_batch_api2,http_batch_api4,http_in_process,http_batch,tserve,profile,engine_load
pairs=""
for first in $(seq 0 2 $((n - 2))); do pairs="$pairs $first,$((first + 1))"; done
for cpus in ${CPUS:-$pairs}; do
  dir=$OUT/run
  timeout "${RUN_S:-90}" taskset -c "$cpus" python -m benchmarks.gpu_bench --out "$dir" --skip "$skip" > "$dir.log" 2>&1
  python - "$dir/gpu_bench.json" "cpus $cpus" >>"$L" 2>&1 <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))["engine"]
print(sys.argv[2], "ttft p50 %.1f ms" % e["ttft_1024_ms_p50"], "all", [round(x, 1) for x in e["ttft_1024_ms_all"]],
      "b1 gap %.3f ms" % e["decode_b1_itl_ms_p50"], "load %.0f s" % e["load_s"])
PY
  rm -rf "$dir" "$dir.log"
done
cat "$L"
