#!/usr/bin/env bash
# One device call for issue 15: does pinning the engine to the CPU cores next to the GPU move its host-bound
# figures (TTFT of a 1,024-token prompt, the decode batch-1 gap, the event-loop lag)? Earlier runs gave each
# process either about 8 or about 13 ms of TTFT, which smells of where the process landed.
#   run tool: command "bash benchmarks/gpu_affinity.sh", carry [".whl"] (as benchmarks/gpu_engine_core.sh)
# Lands in $OUT: log.txt (topology, then one line of figures per run) and each run's TTFT profile
# (MODE ROUND-ttft.txt: the prefill step's kernels and host calls). Runs gpu_bench's engine phase alone (no batch
# profile), in MODES (default: unpinned, then pinned with taskset, inherited by the engine-core process), ROUNDS times.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
L=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >>"$L" 2>&1
export PYTHONPATH=/tmp/site:$PWD
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-F' 'a-f')
local_cpus=$(cat "/sys/bus/pci/devices/${bus:4}/local_cpulist" 2>/dev/null || echo "")
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvidia-smi topo -m; lscpu | grep -i -E "numa|model name|^cpu\(s\)"
  echo "GPU $bus local CPUs: ${local_cpus:-unknown}"; } >>"$L" 2>&1
skip=bandwidth,logits,greedy_fp32,hf,http,http_api2,http_api4,http_batch_api2,http_batch_api4,http_in_process,http_batch,tserve,profile
for round in $(seq "${ROUNDS:-2}"); do
  for mode in ${MODES:-plain pinned}; do
    prefix=""
    [[ $mode == pinned && -n $local_cpus ]] && prefix="taskset -c $local_cpus"
    dir=$OUT/$mode$round
    timeout "${RUN_S:-200}" $prefix python -m benchmarks.gpu_bench --out "$dir" --skip "$skip" > "$dir.log" 2>&1
    python - "$dir/gpu_bench.json" "$mode$round" >>"$L" 2>&1 <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))["engine"]
keys = ("ttft_1024_ms_p50", "ttft_1024_ms_all", "decode_b1_itl_ms_p50", "decode_b1_graph_gpu_ms", "event_loop_lag_ms_p99",
        "event_loop_lag_ms_p99_client", "closed_loop_64_tok_s_client")
print(sys.argv[2], {k: e.get(k) for k in keys})
EOF
    cp "$dir/profile_ttft.txt" "$OUT/$mode$round-ttft.txt" 2>/dev/null
    rm -rf "$dir" "$dir.log"  # the run tool brings back a limited number of files
  done
done
cat "$L"
