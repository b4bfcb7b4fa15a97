# Sourced by the device scripts (benchmarks/gpu_*.sh): the gateway's dependencies that the device lacks, installed
# from the carried .whl/ beside its torch/triton/transformers; L = $OUT/log.txt, which starts with the GPU's name.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
L=$OUT/log.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >>"$L" 2>&1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$L" 2>&1
