"""Which FP8 checkpoint formats we read and the one-line refusal of their options we do not, told from config.json
alone (no torch: the front end refuses them at start-up). The formats are described in
runtime/native/models/fp8_checkpoint.py, which loads them.
"""

from __future__ import annotations

from typing import Any

QUANT_METHODS = ("compressed-tensors", "modelopt", "fp8")  # config.json quant_method values this module reads
# per-tensor weights with static activation scales; per-channel weights with dynamic per-token activations
MODELOPT_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN")


def _fp8_args(args: Any, what: str, group: str) -> None:
    if not isinstance(args, dict) or args.get("num_bits") != 8 or args.get("type") != "float":
        raise ValueError(f"compressed-tensors group {group!r}: only 8-bit float {what} are supported, got {args}")


def check_quantization_config(config: dict[str, Any]) -> None:
    """ValueError naming what we do not serve, for a config.json `quantization_config` this module reads (others
    are refused by the registry)."""
    method = config.get("quant_method")
    if method == "compressed-tensors":
        for name, group in (config.get("config_groups") or {}).items():
            _fp8_args(group.get("weights"), "weights", name)
            if group["weights"].get("strategy") not in ("tensor", "channel"):
                raise ValueError(f"FP8 weight scales by {group['weights'].get('strategy')!r} are not supported "
                                 f"(per tensor or per channel are)")
            inputs = group.get("input_activations")
            if inputs is not None:
                _fp8_args(inputs, "activations", name)
                if inputs.get("strategy") not in ("tensor", "token"):
                    raise ValueError(f"FP8 activation scales by {inputs.get('strategy')!r} are not supported")
    elif method == "modelopt":
        check_modelopt(config)
    elif method == "fp8" and config.get("weight_block_size"):
        raise ValueError("block-wise FP8 weight scales (weight_block_size) are not supported")


def check_modelopt(section: dict[str, Any]) -> None:
    if section.get("quant_algo") not in MODELOPT_ALGOS:
        raise ValueError(f"ModelOpt quant_algo {section.get('quant_algo')!r} is not supported "
                         f"({' and '.join(MODELOPT_ALGOS)} are)")
