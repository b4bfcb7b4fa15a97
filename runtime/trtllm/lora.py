"""TrtllmAdapters: the gateway's LoRA adapters (names, ids, folders) -> TensorRT-LLM LoRARequests.

Names and ids live in the native runtime's registry (runtime.adapter_registry.AdapterRegistry), so both
backends number adapters alike (1, 2, ... in registration order) and a Triton `lora_task_id` naming a
registered adapter's id reaches the same adapter. PEFT folders are checked by the same reader as the
native runtime (runtime.peft_config.read_peft_config). TensorRT-LLM loads the weights itself, from the
folder in `LoRARequest.lora_path` (NVIDIA/TensorRT-LLM tensorrt_llm/executor/request.py @
4ce835a571f85cc37dcffb7268b3a4c014039ce6), into its own two-level adapter cache, sized at start by
LoraConfig (tensorrt_llm/lora_helper.py @ 585c756579dc4d01f21fc13c2f604cdb461ac4f0).
"""

from __future__ import annotations

import os
from typing import Any

from runtime.errors import (
    InvalidRequestError,
    UnknownAdapterError,
    UnknownLoraTaskError,
    UnsupportedOptionError,
)
from runtime.peft_config import read_peft_config
from runtime.adapter_registry import Adapter, AdapterRegistry
from runtime.request import LoraTask

BACKEND = "trtllm"

# Hugging Face (PEFT) module name -> TensorRT-LLM LoRA module name (lora_helper's default table, inverted).
HF_TO_TRTLLM_MODULES = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "qkv_proj": "attn_qkv",
    "o_proj": "attn_dense", "gate_proj": "mlp_h_to_4h", "down_proj": "mlp_4h_to_h",
    "up_proj": "mlp_gate", "gate_up_proj": "mlp_gate_up",
}


def trtllm_target_modules(folder: str, max_rank: int) -> list[str]:
    """TRT-LLM module names of one PEFT folder's target_modules (checked: a LoRA folder within max_rank)."""
    out: list[str] = []
    for module in read_peft_config(folder, max_rank).target_modules:
        trt = HF_TO_TRTLLM_MODULES.get(module.split(".")[-1])
        if trt is None:
            raise InvalidRequestError(f"LoRA adapter at '{folder}': target module '{module}' has no "
                                      "TensorRT-LLM LoRA module", param="lora_path")
        if trt not in out:
            out.append(trt)
    return out


class TrtllmAdapters:
    """Servable adapters and the LoraConfig sizing TensorRT-LLM was started with."""

    def __init__(self, lora_modules: dict[str, str], max_rank: int) -> None:
        self.registry = AdapterRegistry()
        self.max_rank = max_rank
        self.target_modules: list[str] = []  # union over the start-up adapters, for LoraConfig
        for name, path in lora_modules.items():
            for module in trtllm_target_modules(path, max_rank):
                if module not in self.target_modules:
                    self.target_modules.append(module)
            self.registry.add_path(name, path)
        # TRT-LLM sizes its LoRA cache when the LLM is built: adapters can be added later only then.
        self.enabled = bool(lora_modules)

    def adapters(self) -> dict[str, str]:
        """name -> folder of every servable adapter."""
        return self.registry.paths()

    def add(self, name: str, path: str) -> Adapter:
        """Register a PEFT folder at run time (400 when invalid, taken, or outside start-up sizing)."""
        if not self.enabled:
            raise UnsupportedOptionError("load_lora_adapter", BACKEND,
                                         "TensorRT-LLM sizes its LoRA cache at start: start with --lora-modules")
        if not name or name != name.strip():
            raise InvalidRequestError("lora_name must be a non-empty name without surrounding spaces",
                                      param="lora_name")
        if not os.path.isdir(path):
            raise InvalidRequestError(f"LoRA adapter path '{path}' is not a folder", param="lora_path")
        extra = [m for m in trtllm_target_modules(path, self.max_rank) if m not in self.target_modules]
        if extra:
            raise InvalidRequestError(
                f"LoRA adapter at '{path}' targets {extra}, outside the modules TensorRT-LLM was started "
                f"with ({self.target_modules})", param="lora_path")
        if name in self.registry.by_name:
            raise InvalidRequestError(f"The lora adapter '{name}' has already been loaded.", param="lora_name")
        return self.registry.add_path(name, path)

    def remove(self, name: str) -> None:
        adapter = self.registry.by_name.get(name)
        if adapter is None:
            raise UnknownAdapterError(f"The lora adapter '{name}' cannot be found.")
        self.registry.remove(adapter)

    def _find(self, name: str | None, task: LoraTask | None) -> Adapter | None:
        if task is not None:
            if task.weights is not None or task.config is not None:
                raise UnsupportedOptionError(
                    "lora_weights", BACKEND, "TensorRT-LLM's LLM API loads adapters from folders: register "
                    "the adapter (--lora-modules or /v1/load_lora_adapter) and send its lora_task_id alone")
            adapter = self.registry.by_id.get(task.task_id)
            if adapter is None or adapter.path is None:  # a 400, as the Triton backend and the native runtime
                raise UnknownLoraTaskError(task.task_id)
            return adapter
        if name is None:
            return None
        adapter = self.registry.by_name.get(name)
        if adapter is None:
            known = ", ".join(self.registry.by_name) or "none"
            raise UnknownAdapterError(f"The adapter '{name}' is not loaded (loaded: {known}).")
        return adapter

    def request(self, api: Any, name: str | None, task: LoraTask | None = None) -> Any:
        """The LoRARequest for adapter `name` (or Triton task), None for the base model."""
        adapter = self._find(name, task)
        if adapter is None:
            return None
        # lora_int_id keys TRT-LLM's adapter cache. The registration key is never reused, so an adapter
        # unloaded and loaded again (maybe with other weights) under a recycled id cannot hit stale cache.
        return api.LoRARequest(lora_name=adapter.name, lora_int_id=adapter.key, lora_path=adapter.path)
