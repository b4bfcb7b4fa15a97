"""LoraConfig (real: tensorrt_llm/lora_helper.py, a pydantic model)."""

from __future__ import annotations

from typing import Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class LoraConfig(BaseModel):
    """LoRA sizing and adapter folders (PyTorch backend: `lora_dir` adapters are loadable by request)."""

    model_config = ConfigDict(extra="forbid")

    lora_dir: List[str] = Field(default_factory=list)
    lora_ckpt_source: Literal["hf", "nemo"] = "hf"
    max_lora_rank: int = 64
    lora_target_modules: List[str] = Field(default_factory=list)
    trtllm_modules_to_hf_modules: Dict[str, str] = Field(default_factory=dict)
    max_loras: Optional[int] = None
    max_cpu_loras: Optional[int] = None
    swap_gate_up_proj_lora_b_weight: bool = True
