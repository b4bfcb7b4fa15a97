"""gpt-oss: the Llama-family decoder (llama.py) with attention sinks, alternating sliding and full layers, YaRN, and
a mixture-of-experts MLP (moe.py) whose checkpoint stores the experts its own way, converted here on load: bf16
copies as transformers saves them, or OpenAI's own MXFP4 files (openai/gpt-oss-20b, -120b), dequantized once."""

from __future__ import annotations

import torch

from runtime.model_spec import ModelSpec
from runtime.native.models.llama import LlamaForCausalLM

# MXFP4: 4-bit e2m1 values, two a byte (low nibble first), 32 of them sharing a power-of-two scale (a biased byte)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_MXFP4_SUFFIXES = ("_blocks", "_scales")


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 [..., G * 32] from blocks uint8 [..., G, 16] and scales uint8 [..., G] (exponent + 127)."""
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    values = torch.stack((lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]), dim=-1).flatten(-2)  # [..., G, 32]
    values = torch.ldexp(values, scales.to(torch.int32).unsqueeze(-1) - 127)
    return values.flatten(-2)


def _gate_then_up(interleaved: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """gpt-oss interleaves gate and up along the experts' output dim (gate at even indices): gates first, as ours."""
    x = interleaved.movedim(dim, -1)
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1).movedim(-1, dim)


class GptOssForCausalLM(LlamaForCausalLM):
    """Its checkpoint's experts multiply from the left (x @ W): gate_up_proj [E, H, 2I] with gate and up interleaved,
    down_proj [E, I, H]; ours are [E, 2I, H] (gates, then ups) and [E, H, I]. MXFP4 files hold them as
    `*_blocks` and `*_scales` in our [E, out, in] order (gate and up still interleaved)."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(spec, dtype)
        self._held: dict[str, dict[str, torch.Tensor]] = {}  # MXFP4 halves read before their other half

    def checkpoint_target(self, name: str) -> tuple[str, str | None] | None:
        if name.endswith(_MXFP4_SUFFIXES):  # both halves fill the whole stacked parameter (convert_tensor)
            target = super().checkpoint_target(name.removesuffix("_blocks").removesuffix("_scales"))
            return None if target is None else (target[0], None)
        return super().checkpoint_target(name)

    def convert_tensor(self, param_name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        if tensor.dtype == torch.uint8:  # an MXFP4 half: blocks [E, out, G, 16] or scales [E, out, G]
            held = self._held.setdefault(param_name, {})
            held["blocks" if tensor.dim() == 4 else "scales"] = tensor
            if len(held) < 2:
                return None  # the loader copies nothing until the other half is read
            weight = dequantize_mxfp4(held.pop("blocks"), held.pop("scales"))
            del self._held[param_name]
            return _gate_then_up(weight, 1) if param_name.endswith("gate_up_proj") else weight
        if param_name.endswith("experts.gate_up_proj"):
            return _gate_then_up(tensor).transpose(1, 2)
        if param_name.endswith("experts.gate_up_proj_bias"):
            return _gate_then_up(tensor)
        if param_name.endswith("experts.down_proj"):
            return tensor.transpose(1, 2)
        return tensor
