"""LoRA for the native runtime: many PEFT (or TensorRT-LLM-format) adapters over one base model.

    manager.py        LoraManager: registry + host cache + device slots + admission, used by the engine
    registry.py       adapters by name and integer id (Triton lora_task_id)
    peft.py           PEFT folder -> LoraWeights (alpha/r or rsLoRA scaling folded into B)
    trtllm_format.py  Triton lora_weights / lora_config -> LoraWeights
    targets.py        which Linears are adaptable, and how PEFT paths / TRT-LLM module ids name them
    host_cache.py     --max-cpu-loras, LRU, never evicting an adapter in use
    slots.py          --max-loras device slots: stacked A/B per Linear, LRU, pinned while in use
    apply.py          the Linear delta hook: per-token gathered low-rank products in one forward pass
"""

from runtime.native.lora.manager import LoraManager
from runtime.native.lora.weights import LoraPair, LoraWeights

__all__ = ["LoraManager", "LoraPair", "LoraWeights"]
