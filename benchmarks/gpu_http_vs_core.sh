#!/usr/bin/env bash
# One device call for issue 15's remaining figures: where a batch-1 step's host time goes, and HTTP against the
# engine core in interleaved rounds.
#   run tool: command "JOBS='timers 64:1:1 256:4:4' bash benchmarks/gpu_http_vs_core.sh", carry [".whl"].
# JOBS: "timers" = python -m benchmarks.decode_b1 --timers; "S:A:C[:K[:I[:D]]]" = python -m benchmarks.http_vs_core
# with S streams, A front ends (--api-servers), C consumer processes, K load-generator processes (empty: by S),
# --stream-interval I (default 1) and --output-std D (default 0: equal lengths).
# ROUNDS and SECONDS_PER_ROUND set http_vs_core's rounds.
# Lands in $OUT: log.txt, decode_b1.json, http-vs-core-*.json, the servers' logs.
source benchmarks/gpu_setup.sh
git rev-parse --short HEAD >>"$L" 2>&1
for job in ${JOBS:-timers 64:1:1 256:4:4}; do
  echo "== $job $(date +%T)" | tee -a "$L"
  if [[ $job == timers ]]; then
    python -m benchmarks.decode_b1 --timers --seconds "${TIMER_S:-6}" 2>>"$L" | tail -1 | tee "$OUT/decode_b1.json"
  else
    IFS=: read -r streams api consumers clients interval spread <<<"$job"
    python -m benchmarks.http_vs_core --streams "$streams" --api-servers "$api" --consumers "$consumers" \
      ${clients:+--client-processes "$clients"} ${interval:+--stream-interval "$interval"} \
      ${spread:+--output-std "$spread"} \
      --rounds "${ROUNDS:-4}" --seconds "${SECONDS_PER_ROUND:-10}" --out "$OUT" 2>>"$L" | tail -1
  fi
done
