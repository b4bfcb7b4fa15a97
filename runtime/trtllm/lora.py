"""AdapterRegistry: LoRA adapter names (EngineConfig.lora_modules) -> TensorRT-LLM LoRARequests.

Ids are ours: 1, 2, ... in the order the adapters were configured, stable for the process, so the
same name always reaches the same TRT-LLM adapter-cache slot. The PEFT folders' target modules are
translated to TRT-LLM module names for LoraConfig.lora_target_modules.
"""

from __future__ import annotations

import json
import os
from typing import Any

from runtime.errors import UnknownAdapterError

# Hugging Face (PEFT) module name -> TensorRT-LLM LoRA module name (lora_helper's default table, inverted).
HF_TO_TRTLLM_MODULES = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "qkv_proj": "attn_qkv",
    "o_proj": "attn_dense", "gate_proj": "mlp_h_to_4h", "down_proj": "mlp_4h_to_h",
    "up_proj": "mlp_gate", "gate_up_proj": "mlp_gate_up",
}


class AdapterRegistry:
    """Configured adapters by name, with the integer ids TensorRT-LLM keys its cache by."""

    def __init__(self, lora_modules: dict[str, str]) -> None:
        self._paths = dict(lora_modules)
        self._ids = {name: i for i, name in enumerate(self._paths, start=1)}

    @property
    def names(self) -> list[str]:
        return list(self._paths)

    @property
    def paths(self) -> list[str]:
        return list(self._paths.values())

    def adapter_id(self, name: str) -> int:
        if name not in self._ids:
            known = ", ".join(self._paths) or "none"
            raise UnknownAdapterError(f"The adapter '{name}' is not loaded (loaded: {known}).")
        return self._ids[name]

    def request(self, api: Any, name: str | None) -> Any:
        """LoRARequest for adapter `name`; None for the base model."""
        if name is None:
            return None
        return api.LoRARequest(lora_name=name, lora_int_id=self.adapter_id(name), lora_path=self._paths[name])

    def target_modules(self) -> list[str]:
        """TRT-LLM module names covering every adapter's PEFT target_modules (config order)."""
        out: list[str] = []
        for path in self._paths.values():
            cfg_file = os.path.join(path, "adapter_config.json")
            if not os.path.isfile(cfg_file):
                continue
            with open(cfg_file, encoding="utf-8") as f:
                modules = json.load(f).get("target_modules") or []
            for m in [modules] if isinstance(modules, str) else modules:
                trt = HF_TO_TRTLLM_MODULES.get(m.split(".")[-1])
                if trt and trt not in out:
                    out.append(trt)
        return out
