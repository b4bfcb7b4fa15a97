"""Which INT4 weight-only checkpoint formats we read (AWQ's GEMM layout, GPTQ's) and the one-line refusal of their
options we do not, told from config.json alone (no torch: the front end refuses them at start-up). The formats are
described in runtime/native/models/int4_checkpoint.py, which loads them.
"""

from __future__ import annotations

from typing import Any

INT4_METHODS = ("awq", "gptq")  # config.json quant_method values this module reads


def group_size(config: dict[str, Any], in_features: int) -> int:
    """Input rows per scale group; GPTQ's -1 means one group over the whole input."""
    size = int(config.get("group_size", config.get("q_group_size", 128)))
    return in_features if size == -1 else size


def check_int4_config(config: dict[str, Any]) -> None:
    """ValueError naming what we do not serve, for an AWQ or GPTQ `quantization_config`."""
    method = config.get("quant_method")
    bits = config.get("bits", config.get("w_bit"))
    if bits != 4:
        raise ValueError(f"{method} with {bits}-bit weights is not supported (4-bit is)")
    size = config.get("group_size", config.get("q_group_size", 128))
    if not isinstance(size, int) or (size <= 0 and not (method == "gptq" and size == -1)):
        raise ValueError(f"{method} group_size {size!r} is not supported")
    if method == "awq":
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"AWQ version {version!r} is not supported (the GEMM layout is)")
        if config.get("zero_point", True) is not True:
            raise ValueError("AWQ without zero points (zero_point: false) is not supported")
    elif method == "gptq":
        checkpoint_format = config.get("checkpoint_format", "gptq")
        if checkpoint_format not in ("gptq", "gptq_v2"):
            raise ValueError(f"GPTQ checkpoint_format {checkpoint_format!r} is not supported (gptq and gptq_v2 are)")
        if config.get("is_marlin_format"):
            raise ValueError("GPTQ in the Marlin layout (is_marlin_format) is not supported")
