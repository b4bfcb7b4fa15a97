"""`trtllm-gateway serve --triton-model-repo DIR`: engine settings from a backend model repository.

    repo = load_triton_repo("triton_model_repo", cli_fields={"max_batch_size"})
    config = repo.apply(EngineConfig(...), cli_fields)   # flags given on the command line win
    if repo.warning: log.warning(repo.warning)

Reads DIR/tensorrt_llm/config.pbtxt (the backend's model) and, for the tokenizer folder,
DIR/preprocessing/config.pbtxt. Template values fill_template.py left unfilled:
- unquoted ones (`max_batch_size: ${triton_max_batch_size}`) and `gpt_model_path` are errors naming
  them: Triton could not load such a file, and there is no model to serve;
- quoted optional parameters (`"${enable_kv_cache_reuse}"`) count as unset, exactly as the backend
  treated them (it logged "not specified, using default"); they are listed in the warning.
A field named in `cli_fields` is not read from the files, so a flag can stand in for a missing value.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from adapters.triton.pbtxt import Message, Placeholder, PbtxtError, first, model_parameters, parse_pbtxt, \
    placeholders_in
from runtime.config import EngineConfig


class TritonRepoError(ValueError):
    """The model repository cannot be served (missing file, unfilled required value, bad value)."""


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "t", "y", "yes", "on"):
        return True
    if low in ("false", "0", "f", "n", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def _positive_int(text: str) -> int:
    value = int(text.strip())
    if value < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


def _fraction(text: str) -> float:
    value = float(text.strip())
    if not 0.0 < value <= 1.0:
        raise ValueError(f"expected a fraction in (0, 1], got {text!r}")
    return value


def _policy(text: str) -> str:
    if text not in ("max_utilization", "guaranteed_no_evict"):
        raise ValueError(f"expected max_utilization or guaranteed_no_evict, got {text!r}")
    return text


def _device(text: str) -> str:
    ids = [t.strip() for t in text.split(",") if t.strip()]
    if len(ids) != 1 or not ids[0].isdigit():
        raise _Unsupported
    return f"cuda:{ids[0]}"


class _Unsupported(Exception):
    """A parameter value we accept the name of but cannot honour."""


# backend parameter -> (EngineConfig field, parser). The ONE mapping (metadata.py shows it back).
PARAMETER_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "gpt_model_path": ("model", str),
    "engine_dir": ("model", str),
    "tokenizer_dir": ("tokenizer", str),
    "batch_scheduler_policy": ("scheduler_policy", _policy),
    "kv_cache_free_gpu_mem_fraction": ("kv_cache_fraction", _fraction),
    "max_tokens_in_paged_kv_cache": ("max_kv_tokens", _positive_int),
    "enable_chunked_context": ("enable_chunked_prefill", _bool),
    "enable_kv_cache_reuse": ("enable_prefix_caching", _bool),
    "max_beam_width": ("max_beam_width", _positive_int),
    "max_num_sequences": ("max_batch_size", _positive_int),
    "lora_cache_max_adapter_size": ("max_lora_rank", _positive_int),
    "cuda_graph_mode": ("enable_cuda_graphs", _bool),
    "gpu_device_ids": ("device", _device),
}

# Parameters whose every value (or these values) change nothing for us: tuning of the backend's own
# process, or behaviour we always have. Other values of these are unsupported.
_NO_EFFECT: dict[str, tuple[str, ...] | None] = {
    "FORCE_CPU_ONLY_INPUT_TENSORS": None,
    "executor_worker_path": None,
    "cancellation_check_period_ms": None,
    "stats_check_period_ms": None,
    "iter_stats_max_iterations": None,
    "request_stats_max_iterations": None,
    "enable_trt_overlap": None,
    "kv_cache_onboard_blocks": None,
    "multi_block_mode": None,
    "enable_context_fmha_fp32_acc": None,
    "cuda_graph_cache_size": None,
    "speculative_decoding_fast_logits": None,
    "xgrammar_tokenizer_info_path": None,
    "lora_cache_optimal_adapter_size": None,  # used to size max_cpu_loras below
    "lora_cache_host_memory_bytes": None,  # -> max_cpu_loras (below)
    "exclude_input_in_output": None,  # a serving default of the Triton dialect (returned separately)
    "participant_ids": ("",),
    "num_nodes": ("1",),
    "gpu_weights_percent": ("1", "1.0"),
    "normalize_log_probs": ("true", "True", "1"),
    "guided_decoding_backend": ("xgrammar",),
    "gpt_model_type": ("inflight_fused_batching", "inflight_batching"),
    "batching_strategy": ("inflight_fused_batching", "inflight_batching"),
    # Sampling modes are chosen per request by our sampler; speculative modes are not supported here.
    "decoding_mode": ("top_k", "top_p", "top_k_top_p", "beam_search", "auto"),
}
_REQUIRED_PARAMETERS = {"gpt_model_path": "model"}  # parameter -> the CLI field that may stand in
_TOP_LEVEL_FIELDS = {"triton_max_batch_size": "max_batch_size", "max_queue_size": "max_queue_size"}


@dataclass
class TritonRepoSettings:
    """What a backend model repository says about serving (engine field values and dialect defaults)."""

    engine: dict[str, Any]  # EngineConfig field -> value read from the files
    tokenizer_dir: str | None
    exclude_input_in_output: bool  # the Triton dialect's default for requests that do not say
    unsupported: list[str] = field(default_factory=list)  # "name=value" set but not honoured
    unfilled: list[str] = field(default_factory=list)  # optional parameters left as ${...}
    config_path: str = ""

    @property
    def warning(self) -> str | None:
        """One line for the log, or None when everything in the files is honoured."""
        parts = []
        if self.unsupported:
            parts.append("ignoring parameters this gateway does not support: " + ", ".join(self.unsupported))
        if self.unfilled:
            parts.append("parameters left unfilled (defaults apply): " + ", ".join(self.unfilled))
        return f"{self.config_path}: " + "; ".join(parts) if parts else None

    def apply(self, config: EngineConfig, cli_fields: Collection[str] = ()) -> EngineConfig:
        """`config` with the repository's values, except fields set on the command line."""
        return dataclasses.replace(config, **{k: v for k, v in self.engine.items() if k not in cli_fields})


def _read(path: str) -> Message:
    try:
        with open(path, encoding="utf-8") as f:
            return parse_pbtxt(f.read())
    except PbtxtError as exc:
        raise TritonRepoError(f"{path}: {exc}") from exc


def _find_trtllm_config(repo: str) -> str:
    for candidate in (os.path.join(repo, "tensorrt_llm", "config.pbtxt"), os.path.join(repo, "config.pbtxt")):
        if os.path.isfile(candidate):
            return candidate
    if os.path.isdir(repo):  # a renamed model folder: find the one running the tensorrtllm backend
        for entry in sorted(os.listdir(repo)):
            path = os.path.join(repo, entry, "config.pbtxt")
            if os.path.isfile(path) and first(_read(path), "backend") == "tensorrtllm":
                return path
    raise TritonRepoError(f"{repo}: no tensorrt_llm/config.pbtxt (the backend's model) in this model repository")


def _unquoted_placeholders(msg: Any) -> list[str]:
    found: list[str] = []
    if isinstance(msg, dict):
        for values in msg.values():
            for v in values:
                found += [v.name] if isinstance(v, Placeholder) else _unquoted_placeholders(v)
    return found


def load_triton_repo(path: str, cli_fields: Collection[str] = ()) -> TritonRepoSettings:
    """Engine settings and Triton-dialect defaults from a backend model repository folder.

    Raises TritonRepoError naming unfilled required template values and unparsable parameters.
    """
    config_path = _find_trtllm_config(path)
    msg = _read(config_path)
    params = model_parameters(msg)
    cli = set(cli_fields)
    missing = sorted({p for p in _unquoted_placeholders(msg) if _TOP_LEVEL_FIELDS.get(p) not in cli})
    missing += [f"{name} (${{{placeholders_in(params[name])[0]}}})" for name, stand_in in
                _REQUIRED_PARAMETERS.items()
                if name in params and placeholders_in(params[name]) and stand_in not in cli]
    if not any(p in params for p in ("gpt_model_path", "engine_dir")) and "model" not in cli:
        missing.append("gpt_model_path (absent)")
    if missing:
        raise TritonRepoError(
            f"{config_path}: unfilled template values: {', '.join(missing)}. Fill them with the backend's "
            "tools/fill_template.py, or give the matching command-line flags."
        )
    engine: dict[str, Any] = {}
    unsupported: list[str] = []
    unfilled: list[str] = []
    errors: list[str] = []
    for name, raw in params.items():
        if placeholders_in(raw):
            unfilled.append(name)
            continue
        if name in PARAMETER_FIELDS:
            target, parse = PARAMETER_FIELDS[name]
            try:
                engine[target] = parse(raw)
            except _Unsupported:
                unsupported.append(f"{name}={raw}")
            except ValueError as exc:
                errors.append(f"{name}: {exc}")
            continue
        allowed = _NO_EFFECT.get(name, ())
        if name in _NO_EFFECT and (allowed is None or raw.strip() in allowed):
            continue
        if raw.strip() != "":  # an empty string means "not set" for every backend parameter
            unsupported.append(f"{name}={raw}")
    max_batch = first(msg, "max_batch_size")
    if isinstance(max_batch, int) and max_batch > 0:
        engine.setdefault("max_batch_size", max_batch)
    queue = first(first(first(msg, "dynamic_batching", {}), "default_queue_policy", {}), "max_queue_size")
    if isinstance(queue, int) and queue > 0:  # 0 is Triton's "unbounded": keep our bound
        engine["max_queue_size"] = queue
    exclude = False
    if "exclude_input_in_output" in params and not placeholders_in(params["exclude_input_in_output"]):
        try:
            exclude = _bool(params["exclude_input_in_output"])
        except ValueError as exc:
            errors.append(f"exclude_input_in_output: {exc}")
    if errors:
        raise TritonRepoError(f"{config_path}: bad parameter values: " + "; ".join(errors))
    tokenizer_dir = engine.get("tokenizer") or _preprocessing_tokenizer(os.path.dirname(config_path))
    if tokenizer_dir and "tokenizer" not in engine:
        engine["tokenizer"] = tokenizer_dir
    _size_cpu_loras(engine, params, unsupported)
    for key in sorted(set(cli) & set(engine)):
        del engine[key]  # the command line wins; nothing to report for overridden values
    return TritonRepoSettings(engine, tokenizer_dir, exclude, unsupported, unfilled, config_path)


def _preprocessing_tokenizer(model_dir: str) -> str | None:
    """tokenizer_dir of the sibling preprocessing model (the ensemble's text -> ids step), if filled."""
    path = os.path.join(os.path.dirname(model_dir), "preprocessing", "config.pbtxt")
    if not os.path.isfile(path):
        return None
    value = model_parameters(_read(path)).get("tokenizer_dir", "")
    return value if value and not placeholders_in(value) else None


def _size_cpu_loras(engine: dict[str, Any], params: dict[str, str], unsupported: list[str]) -> None:
    """lora_cache_host_memory_bytes -> max_cpu_loras: how many adapters of the optimal rank fit.

    TRT-LLM pages its host LoRA cache by `lora_cache_optimal_adapter_size`; an adapter of that rank on
    every attention and MLP projection of every layer takes rank * sum(in + out) * layers fp16 values.
    Needs the checkpoint's config.json; without it the parameter is reported as unsupported.
    """
    raw = params.get("lora_cache_host_memory_bytes", "")
    if not raw or placeholders_in(raw):
        return
    rank_raw = params.get("lora_cache_optimal_adapter_size", "8")
    rank = int(rank_raw) if rank_raw.strip().isdigit() else 8
    config_json = os.path.join(str(engine.get("model", "")), "config.json")
    try:
        with open(config_json, encoding="utf-8") as f:
            cfg = json.load(f)
        hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        kv = int(cfg.get("num_key_value_heads", heads)) * head_dim
        inter = int(cfg.get("intermediate_size", 4 * hidden))
        host_bytes = int(raw)
    except (OSError, KeyError, ValueError, TypeError):
        unsupported.append(f"lora_cache_host_memory_bytes={raw}")
        return
    q_out = heads * head_dim
    per_layer = (hidden + q_out) + 2 * (hidden + kv) + (q_out + hidden) + 2 * (hidden + inter) + (inter + hidden)
    adapter_bytes = rank * per_layer * layers * 2
    engine["max_cpu_loras"] = max(1, host_bytes // adapter_bytes)
