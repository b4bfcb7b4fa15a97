"""llama.cpp as a peer on the CPU: `llama-server` and `llama-quantize` built from the llama-cpp-python source
package on PyPI (the only way to get them here), cached, and the GGUF files they serve.

    tools = ensure_built()                         # ~/.cache/trtllm-gateway/llama.cpp/<version>/bin
    bf16 = requantized(tools, gguf, "BF16")        # the same weights at our serving precision, cached
    command = server_command(tools, bf16, threads=2, slots=32)   # for benchmarks.procs.Server
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

VERSION = "0.3.36"  # llama-cpp-python's sdist, which vendors llama.cpp
CACHE = Path.home() / ".cache" / "trtllm-gateway" / "llama.cpp"


@dataclass(frozen=True)
class LlamaCppTools:
    server: Path
    quantize: Path


def ensure_built(console: Console, version: str = VERSION, jobs: int = 2) -> LlamaCppTools:
    """The two binaries, built once (4-8 min on 2 cores) into the cache."""
    root = CACHE / version
    tools = LlamaCppTools(root / "bin" / "llama-server", root / "bin" / "llama-quantize")
    if tools.server.exists() and tools.quantize.exists():
        return tools
    with tempfile.TemporaryDirectory() as tmp:
        console.print(f"[dim]llama.cpp: downloading llama-cpp-python {version} (source)[/dim]")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", tmp], check=True)
        (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        src = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = src / "build"
        console.print(f"[dim]llama.cpp: building llama-server and llama-quantize ({jobs} jobs, minutes)[/dim]")
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                        "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                        "-DLLAMA_BUILD_SERVER=ON", "-DBUILD_SHARED_LIBS=OFF"], check=True, capture_output=True)
        subprocess.run(["cmake", "--build", str(build), "-j", str(jobs), "--target", "llama-server",
                        "llama-quantize"], check=True, capture_output=True)
        tools.server.parent.mkdir(parents=True, exist_ok=True)
        for name in ("llama-server", "llama-quantize"):
            (build / "bin" / name).replace(root / "bin" / name)
    return tools


def requantized(tools: LlamaCppTools, gguf: Path, qtype: str) -> Path:
    """`gguf` converted to `qtype` (e.g. BF16) by llama-quantize, once; the file itself when it is that type."""
    if qtype.upper() in gguf.name.upper():
        return gguf
    out = CACHE / f"{gguf.stem}.{qtype}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(tools.quantize), "--allow-requantize", str(gguf), str(out), qtype], check=True,
                       capture_output=True)
    return out


def server_command(tools: LlamaCppTools, gguf: Path, threads: int, slots: int, context: int = 512) -> list[str]:
    """llama-server with continuous batching over `slots` parallel sequences of `context` tokens each.

    A quantized file is served without weight repacking: repacked for AMX (a native build on a CPU with AMX-INT8),
    its first product faults in `ldtilecfg` on the dev box (SIGSEGV or SIGILL, 2026-11-26), where BF16 files,
    which ggml does not repack for AMX, run."""
    command = [str(tools.server), "-m", str(gguf), "--host", "127.0.0.1", "--port", "{port}", "-t", str(threads),
               "-np", str(slots), "-cb", "-c", str(context * slots), "--log-disable"]
    return command if any(t in gguf.name.upper() for t in ("BF16", "F16", "F32")) else command + ["--no-repack"]
