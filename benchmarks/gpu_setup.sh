# Sourced by the device scripts (benchmarks/gpu_*.sh): the gateway's dependencies that the device lacks, installed
# from the carried .whl/ (made here by `bash benchmarks/gpu_wheels.sh`) beside its torch/triton/transformers;
# L = $OUT/log.txt, which starts with the GPU's name.
# The phases' clock: `left N` is N seconds or what is left of $BUDGET_S (set before sourcing), `stamp` logs a phase;
# `cuda_tests N FILES...` runs test files on the GPU (ENGINE_TEST_DEVICE=cuda) into $OUT/tests_cuda.txt.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
L=$OUT/log.txt
# a call without .whl uses the site an earlier call of the same warm machine installed (benchmarks/gpu_eagle.sh)
[[ -d .whl ]] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  >>"$L" 2>&1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$L" 2>&1
T0=$(date +%s)
left() {  # seconds a phase may take: $1, or what is left of the budget (at least 1)
  local rest=$(( BUDGET_S - ($(date +%s) - T0) ))
  (( rest > $1 )) && rest=$1
  echo $(( rest < 1 ? 1 : rest ))
}
stamp() { echo "=== +$(( $(date +%s) - T0 ))s $*" | tee -a "$L"; }
cuda_tests() {
  ENGINE_TEST_DEVICE=cuda timeout "$(left "$1")" python -m pytest -q -p no:cacheprovider --durations=12 "${@:2}" \
    > $OUT/tests_cuda.txt 2>&1
  echo "rc $?" >> $OUT/tests_cuda.txt; tail -15 $OUT/tests_cuda.txt | tee -a "$L"
}
python -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)" >>"$L" 2>&1
