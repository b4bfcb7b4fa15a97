"""The INT4 GEMV's step loop (runtime/native/cuda/int4_gemv.py) compiled for an H200 (sm_90) without a GPU, with
Triton's own ptxas: its instructions by opcode and per weight. A static count (the loop's body once, its unrolled
nibble positions included), no timing: what a path costs the CUDA cores (LOP3 / FADD / FFMA or HFMA2 a weight,
constants rematerialized, spills). Triton here may not be the H200's (3.6 there): the counts are this Triton's.

    python -m benchmarks.int4_gemv_sass                       # the benchmark's tiles, K 4096, bf16
    python -m benchmarks.int4_gemv_sass --tile 128,16,4,1,0,1 --k 14336 --dtype fp16
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

GROUP = 128
_OPCODE = re.compile(r"(?m)^\S*\t(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_]+)")


def loop_census(sass: str, weights_per_thread: float) -> dict[str, Any]:
    """The opcodes of the longest loop (a label and the backward branch to it) in `sass` (Triton's get_sass text),
    their total and the total per weight a thread handles in one pass of the loop."""
    lines = sass.splitlines()
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.fullmatch(r"\.?L\w+:", line)}
    loops = [(labels[m[1]], i) for i, line in enumerate(lines)
             if (m := re.search(r"BRA (\.?L\w+);", line)) and labels.get(m[1], i) < i]
    start, end = max(loops, key=lambda loop: loop[1] - loop[0], default=(0, len(lines) - 1))
    opcodes = Counter(_OPCODE.findall("\n".join(lines[start:end + 1])))
    total = sum(opcodes.values())
    return {"per_weight": round(total / weights_per_thread, 2), "instructions": total,
            "opcodes": dict(opcodes.most_common())}


def registers(cubin: bytes) -> int:
    """Registers a thread of the kernel in `cubin` (cuobjdump's -res-usage; a loaded kernel's n_regs needs a GPU)."""
    import triton.backends.nvidia

    tool = Path(triton.backends.nvidia.__file__).parent / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return int(re.findall(r"\bREG:(\d+)", usage)[0])


def compile_sm90(tile: tuple[int, ...], k: int = 4096, dtype: str = "bf16") -> Any:
    """The kernel as int4_gemv launches it at one token (PDL on, pointers and sizes 16-byte aligned), for sm_90;
    SPLIT 0 (as many as fill the GPU) counts as split."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    from runtime.native.cuda import int4_gemv

    block_n, words, warps, ahead, split, pairs = tile
    signature = {"x_ptr": f"*{dtype}", "q_ptr": "*i32", "z_ptr": "*u8", "s_ptr": f"*{dtype}", "out_ptr": f"*{dtype}",
                 "parts_ptr": "*fp32", "arrivals_ptr": "*i32", "N": "i32", "magic": "i32", "n_parts": "i32",
                 "span": "i32"}
    constants = {"K": k, "GROUPS": k // GROUP, "GROUP": GROUP, "BLOCK_N": block_n, "WORDS": min(words, GROUP // 8),
                 "AHEAD": ahead, "SPLIT_K": split != 1, "PAIRS": pairs if dtype != "fp32" else 0, "PDL": True}
    signature.update(dict.fromkeys(constants, "constexpr"))
    aligned = {(i,): [["tt.divisibility", 16]] for i in (*range(8), 10)}
    source = ASTSource(int4_gemv._int4_gemv_kernel, signature, constexprs=constants, attrs=aligned)
    return triton_compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 1})


def census(tile: tuple[int, ...], k: int = 4096, dtype: str = "bf16") -> dict[str, Any]:
    """loop_census of the kernel at `tile` for sm_90, with its registers a thread."""
    from triton.tools.disasm import get_sass

    kernel = compile_sm90(tile, k, dtype)
    block_n, words, warps = tile[:3]
    weights = block_n * min(words, GROUP // 8) * 8 / (32 * warps)
    return {**loop_census(get_sass(kernel.asm["cubin"]), weights), "registers": registers(kernel.asm["cubin"])}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.gpu_int4_gemv import TILES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tile", help="BLOCK_N,WORDS,warps,AHEAD,SPLIT,PAIRS (default: the benchmark's tiles)")
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    args = parser.parse_args(argv)
    for tile in [tuple(map(int, args.tile.split(",")))] if args.tile else TILES:
        found = census(tile, args.k, args.dtype)
        print("x".join(map(str, tile)), found["per_weight"], "a weight", found["registers"], "registers",
              json.dumps(found["opcodes"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
