"""gpt-oss: the Llama-family decoder (llama.py) with attention sinks, alternating sliding and full layers, YaRN, and
a mixture-of-experts MLP (moe.py) whose checkpoint stores the experts its own way, converted here on load."""

from __future__ import annotations

import torch

from runtime.models.llama import LlamaForCausalLM


def _gate_then_up(interleaved: torch.Tensor) -> torch.Tensor:
    """gpt-oss interleaves gate and up along its last dim (gate at even indices): put the gates first, as ours."""
    return torch.cat((interleaved[..., 0::2], interleaved[..., 1::2]), dim=-1)


class GptOssForCausalLM(LlamaForCausalLM):
    """Its checkpoint's experts multiply from the left (x @ W): gate_up_proj [E, H, 2I] with gate and up interleaved,
    down_proj [E, I, H]; ours are [E, 2I, H] (gates, then ups) and [E, H, I]."""

    def convert_tensor(self, param_name: str, tensor: torch.Tensor) -> torch.Tensor:
        if param_name.endswith("experts.gate_up_proj"):
            return _gate_then_up(tensor).transpose(1, 2)
        if param_name.endswith("experts.gate_up_proj_bias"):
            return _gate_then_up(tensor)
        if param_name.endswith("experts.down_proj"):
            return tensor.transpose(1, 2)
        return tensor
