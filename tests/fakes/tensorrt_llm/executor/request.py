"""LoRARequest (real: NVIDIA/TensorRT-LLM tensorrt_llm/executor/request.py @ 4ce835a571f85cc37dcffb7268b3a4c014039ce6)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(slots=True)
class LoRARequest:
    """Request for a LoRA adapter; the path must exist when the request is made."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"

    def __post_init__(self) -> None:
        if self.lora_path is not None and not os.path.exists(self.lora_path):
            raise ValueError(f"lora_path ({self.lora_path}) does not exist.")
        if self.lora_ckpt_source not in ["hf", "nemo"]:
            raise ValueError(f"lora_ckpt_source must be 'hf' or 'nemo', got '{self.lora_ckpt_source}'")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
