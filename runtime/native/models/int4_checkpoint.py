"""Loading INT4 weight-only checkpoints: AWQ (GEMM layout) and GPTQ, declared by config.json's `quantization_config`.

Each quantized projection stores, in place of `<module>.weight` ([out, in] float):
- AWQ (AutoAWQ, `version: "gemm"`): `qweight` int32 [in, out/8], each int32 holding 8 output columns' 4-bit values,
  column 8j + AWQ_ORDER[i] in bits 4i..4i+3; `qzeros` int32 [in/group, out/8] packed the same way; `scales` float16
  [in/group, out]. W[k, n] = (q[k, n] - z[k // group, n]) * s[k // group, n].
- GPTQ (AutoGPTQ / GPTQModel): `qweight` int32 [in/8, out], input row 8i + j in bits 4j of row i; `qzeros` int32
  [groups, out/8], output column 8j + i in bits 4i; `scales` float16 [groups, out]; `g_idx` int32 [in], the group of each
  input row (k // group without act-order; any order with `desc_act: true`). The classic format
  (`checkpoint_format: "gptq"`, the default) stores each zero point minus one: W = (q - (z + 1)) * s[g_idx];
  `gptq_v2` stores it as it is.
The reference dequantization here is exact in float32 (a 4-bit integer times a float16 scale). This loader dequantizes
every INT4 weight as it is read, with one log line saying so.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from runtime.int4_config import INT4_METHODS, check_int4_config, group_size
from runtime.native.models.base import CausalLM

logger = logging.getLogger(__name__)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's interleave: nibble i of an int32 holds column AWQ_ORDER[i]
_PARTS = ("qweight", "qzeros", "scales", "g_idx")


def int4_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The checked AWQ/GPTQ `quantization_config`, or None for other checkpoints; ValueError for an unsupported one."""
    quantization = config.get("quantization_config") or {}
    if quantization.get("quant_method") not in INT4_METHODS:
        return None
    check_int4_config(quantization)
    return quantization


def unpack_int4(packed: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """int32 values holding eight 4-bit values each, unpacked along `dim` (8x longer) as int32 in 0..15; `order[i]`:
    which of the 8 positions nibble i (bits 4i..4i+3) holds."""
    shifts = torch.tensor([4 * order.index(position) for position in range(8)], dtype=torch.int32)
    moved = packed.movedim(dim, -1)
    values = (moved.unsqueeze(-1) >> shifts) & 0xF  # [..., packed, 8]: position p at [..., p]
    return values.reshape(*moved.shape[:-1], -1).movedim(-1, dim)


def dequantize_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """AWQ GEMM tensors to the float32 weight [out, in]."""
    q, zeros = unpack_int4(qweight, 1, AWQ_ORDER), unpack_int4(qzeros, 1, AWQ_ORDER)
    group = q.shape[0] // scales.shape[0]
    rows = torch.arange(q.shape[0]) // group
    return ((q - zeros[rows]).float() * scales.float()[rows]).t().contiguous()


def dequantize_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                    v2: bool = False) -> torch.Tensor:
    """GPTQ tensors to the float32 weight [out, in]; the classic format's zero points are stored minus one."""
    q, zeros = unpack_int4(qweight, 0), unpack_int4(qzeros, 1) + (0 if v2 else 1)
    rows = g_idx.long()
    return ((q - zeros[rows]).float() * scales.float()[rows]).t().contiguous()


class Int4Reader:
    """Collects each INT4 projection's packed tensors as the loader reads them (in any order) and hands back its
    dequantized `<module>.weight` once all are read."""

    def __init__(self, model: CausalLM, config: dict[str, Any]) -> None:
        self.method = config["quant_method"]
        self.config = config
        self.v2 = config.get("checkpoint_format") == "gptq_v2"
        self.dtype = model.output_embedding().dtype
        self.needed = ("qweight", "qzeros", "scales") + (("g_idx",) if self.method == "gptq" else ())
        self.dequantized = 0
        self._held: dict[str, dict[str, torch.Tensor]] = {}

    def takes(self, name: str) -> bool:
        """Whether `name` is a packed INT4 tensor (through `accept`)."""
        return name.rpartition(".")[2] in _PARTS

    def accept(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The dequantized (`<module>.weight`, tensor) once a projection's packed tensors are all read; else none."""
        module, _, kind = name.rpartition(".")
        held = self._held.setdefault(module, {})
        held[kind] = tensor
        if any(part not in held for part in self.needed):
            return []
        del self._held[module]
        if self.method == "awq":
            weight = dequantize_awq(held["qweight"], held["qzeros"], held["scales"])
        else:
            weight = dequantize_gptq(held["qweight"], held["qzeros"], held["scales"], held["g_idx"], self.v2)
        in_features = weight.shape[1]
        if held["scales"].shape[0] * group_size(self.config, in_features) != in_features and self.method == "awq":
            raise ValueError(f"{module}.scales has {held['scales'].shape[0]} groups for {in_features} inputs in "
                             f"groups of {group_size(self.config, in_features)}")
        self.dequantized += 1
        return [(f"{module}.weight", weight.to(self.dtype))]

    def finish(self) -> None:
        """After the last tensor: the log line (and an error naming projections missing packed tensors)."""
        if self._held:
            raise ValueError(f"INT4 weights missing packed tensors in the checkpoint: {', '.join(sorted(self._held))}")
        logger.info("%s INT4 checkpoint: %d projections dequantized to %s at load (no INT4 kernels on this path)",
                    self.method.upper(), self.dequantized, self.dtype)

