#!/usr/bin/env bash
# Here, before device calls: the gateway's dependencies that the GPU image lacks (its python3 is 3.12 with torch,
# triton, transformers, grpcio, protobuf, prometheus-client... already: the device library's KINDS.md lists them), as
# py3.12 manylinux wheels at constraints.txt's versions, into .whl/ (ignored; ~14 MB), which calls carry and
# benchmarks/gpu_setup.sh installs. `echo /.whl/ >> .git/info/exclude` once if git shows it.
set -eu
names="annotated-types gguf httptools msgspec orjson pydantic pydantic-core pytest-asyncio python-rapidjson pyzmq
sse-starlette starlette tritonclient typing-inspection uvicorn xgrammar apache-tvm-ffi openai jiter distro
httpx2 httpcore2 truststore sniffio anyio h11 idna"
pins=()
for name in $names; do
  pin=$(grep -i "^$name==" constraints.txt) || { echo "$name is not in constraints.txt" >&2; exit 1; }
  pins+=("$pin")
done
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .whl "${pins[@]}"
du -sh .whl
