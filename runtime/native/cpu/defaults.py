"""What the native runtime runs on a CPU when its options are left at "auto": the settings measured fastest that
keep the model's quality, from what the CPU offers and what the checkpoint holds. Logged in one line at start-up.

- dtype: bfloat16 where the CPU multiplies bf16 natively (AVX-512 BF16 or AMX) and the checkpoint is bf16 or was
  quantized below it (a GGUF file with 4- or 8-bit blocks: bf16 activations cost it nothing measurable); float32
  checkpoints keep float32 (their values, exactly), bf16 ones bf16 everywhere.
- weight-only quantization: what the checkpoint already was. A GGUF file whose projections are 4-bit blocks is
  served as int4 (requantizing those blocks in groups of 32 recovers their values, up to rounding the scales), one
  with 5- to 8-bit blocks as int8; float checkpoints are not quantized, since nothing measured their loss.
  For the default model (Q4_1 projections, a Q8_0 head) bf16 + int4 scores perplexity -0.03% against bf16 without
  quantization and decodes one stream about 8x faster (benchmarks/RESULTS.md, 2026-11-28 17:44).
- threads: runtime/native/device.py's `cpu_thread_count` (all cores but one: the front end keeps a core).
- compiled steps: the C++ decode step where the model allows it (runtime/native/cpu/native_decode.py), else torch.compile's
  one-stream step where it pays (runtime/native/cpu/compiled_decode.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from runtime.native.models.cpu_weights import Quantization

logger = logging.getLogger(__name__)

# GGUF block types by the weight-only form that keeps their values
FOUR_BIT = {"Q4_0", "Q4_1", "Q4_K", "Q3_K", "Q2_K"}
EIGHT_BIT = {"Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"}
_SHOWN = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512_vnni", "AVX-512 VNNI"), ("avx512f", "AVX-512"),
          ("avx2", "AVX2"))


@dataclass(frozen=True)
class CpuFeatures:
    """The instruction sets that decide the CPU's settings, from /proc/cpuinfo's flags (torch's view elsewhere)."""

    flags: frozenset[str]

    @classmethod
    def detect(cls) -> CpuFeatures:
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("flags"):
                        return cls(frozenset(line.split(":", 1)[1].split()))
        except OSError:
            pass
        capability = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2", "DEFAULT", ...
        return cls(frozenset({"avx512f", "avx2"} if capability == "AVX512" else {"avx2"} if capability == "AVX2"
                             else set()))

    @property
    def bf16_products(self) -> bool:
        return bool(self.flags & {"avx512_bf16", "amx_bf16"})

    def describe(self) -> str:
        shown = [name for flag, name in _SHOWN if flag in self.flags]
        return ", ".join(shown) if shown else "none of AMX, AVX-512, AVX2"


def source_quantization(checkpoint_config: dict[str, object]) -> Quantization:
    """The weight-only form that keeps what a checkpoint holds: from the block types of a converted GGUF file's
    layers (runtime/native/models/gguf.py records them), "none" for float checkpoints."""
    types = set(checkpoint_config.get("gguf_layer_types") or ())  # type: ignore[call-overload]
    if types and types <= FOUR_BIT:
        return "int4"
    if types and types <= FOUR_BIT | EIGHT_BIT:
        return "int8"
    return "none"


def cpu_dtype(requested: str, checkpoint: torch.dtype, source: Quantization, features: CpuFeatures) -> torch.dtype:
    """The dtype "auto" means on this CPU (see the module docstring); an explicit one as given."""
    from runtime.native.device import resolve_dtype

    if requested == "auto" and source != "none" and features.bf16_products:
        return torch.bfloat16
    return resolve_dtype(requested, torch.device("cpu"), checkpoint)


def cpu_quantization(requested: str, source: Quantization) -> Quantization:
    """The weight-only form "auto" means: the checkpoint's own (see the module docstring)."""
    return source if requested == "auto" else requested  # type: ignore[return-value]


def log_choice(dtype: torch.dtype, quantization: Quantization, threads: int, steps: str,
               features: CpuFeatures) -> None:
    """The one line that says what this CPU runs."""
    weights = "no weight-only quantization" if quantization == "none" else f"{quantization} weight-only"
    logger.info("CPU settings: %s activations, %s, %d torch thread%s, %s (the CPU has %s)",
                str(dtype).removeprefix("torch."), weights, threads, "" if threads == 1 else "s", steps,
                features.describe())
