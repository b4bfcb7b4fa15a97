"""TensorRT-LLM's LoRA tensors (Triton `lora_weights` + `lora_config`) -> LoraWeights.

`lora_config` rows are [module_id, layer_idx, adapter_size R] (a fourth is_dora column is accepted
when 0). Row i of `lora_weights` holds that module's A (R x Hin) flattened, then B (Hout x R)
flattened, zero-padded to the row width. The weights are used as given: TensorRT-LLM expects any
alpha/r scaling to be folded in already.
"""

from __future__ import annotations

from typing import Any

import torch

from runtime.errors import InvalidRequestError
from runtime.native.lora.targets import LoraTargets
from runtime.native.lora.weights import LoraPair, LoraWeights


def _bad(message: str, param: str = "lora_weights") -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param=param)


def weights_from_trtllm(weights: Any, config: Any, targets: LoraTargets, max_rank: int,
                        dtype: torch.dtype = torch.float32) -> LoraWeights:
    """Check the two tensors against the model and cut them into per-module pairs."""
    try:
        w = torch.as_tensor(weights, dtype=torch.float32)
        c = torch.as_tensor(config, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise _bad(f"not a numeric tensor ({exc})") from None
    # A leading batch dimension of 1, as Triton clients send [1, rows, width].
    if w.dim() == 3 and w.shape[0] == 1:
        w = w[0]
    if c.dim() == 3 and c.shape[0] == 1:
        c = c[0]
    if c.dim() != 2 or c.shape[1] not in (3, 4) or c.shape[0] == 0:
        raise _bad(f"expected shape [rows, 3], got {list(c.shape)}", "lora_config")
    if w.dim() != 2 or w.shape[0] != c.shape[0]:
        raise _bad(f"expected shape [{c.shape[0]}, width] (one row per lora_config row), got {list(w.shape)}")
    if not torch.isfinite(w).all():
        raise _bad("contains NaN or infinite values")
    out = LoraWeights()
    seen: set[tuple[int, int]] = set()
    for i, row in enumerate(c.tolist()):
        module_id, layer, rank = row[:3]
        if len(row) == 4 and row[3]:
            raise _bad(f"row {i}: DoRA adapters (is_dora = 1) are not supported", "lora_config")
        if (module_id, layer) in seen:
            raise _bad(f"row {i}: module {module_id} of layer {layer} is given twice", "lora_config")
        seen.add((module_id, layer))
        if not 1 <= rank <= max_rank:
            raise _bad(f"row {i}: adapter size {rank} must be between 1 and the maximum rank ({max_rank})",
                       "lora_config")
        module, start, size = targets.resolve_trtllm(module_id, layer)
        fan_in = targets.modules[module].full_in_features
        need = rank * fan_in + size * rank
        if need > w.shape[1]:
            raise _bad(f"row {i} needs {need} values (R={rank}: {rank}x{fan_in} A + {size}x{rank} B), "
                       f"the rows have {w.shape[1]}")
        a = w[i, : rank * fan_in].reshape(rank, fan_in)
        b = w[i, rank * fan_in : need].reshape(size, rank)
        out.add(module, LoraPair(start, size, a.to(dtype).contiguous(), b.to(dtype).contiguous()))
    return out
