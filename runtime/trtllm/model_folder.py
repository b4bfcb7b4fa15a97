"""ModelFolder: what `--model` points at (a Hugging Face checkpoint or a trtllm-build engine folder).

An engine folder's config.json holds `pretrained_config` and `build_config` (written by trtllm-build);
the context window is then the engine's build_config.max_seq_len and the tokenizer must come from
`--tokenizer` (engine folders carry no tokenizer). Context logits (prompt logprobs) come from an engine only
when it was built with gather_context_logits (TensorRT-LLM's _TrtLLM._check_arguments reads its build_config).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from runtime.errors import InvalidRequestError


@dataclass(frozen=True)
class ModelFolder:
    """Facts read from the model folder's config.json."""

    path: str
    is_engine: bool
    tokenizer_path: str
    context_window: int  # max prompt + output tokens the model (or engine) supports
    vocab_size: int  # logits width (embedding rows), for embedding_bias
    dtype: str
    context_logits: bool = True  # whether requests may ask for context logits / prompt logprobs

    @classmethod
    def inspect(cls, path: str, tokenizer: str | None, max_model_len: int | None) -> ModelFolder:
        """Read `path`/config.json; `max_model_len` caps the context window."""
        cfg_file = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_file):
            raise InvalidRequestError(f"{path} has no config.json: not a model or engine folder", "model")
        with open(cfg_file, encoding="utf-8") as f:
            cfg = json.load(f)
        is_engine = "build_config" in cfg and "pretrained_config" in cfg
        if is_engine:
            pretrained, build = cfg["pretrained_config"], cfg["build_config"]
            window = int(build.get("max_seq_len") or pretrained.get("max_position_embeddings"))
            vocab, dtype = int(pretrained["vocab_size"]), str(pretrained.get("dtype", ""))
            context_logits = bool(build.get("gather_context_logits"))
            if tokenizer is None:
                raise InvalidRequestError(
                    f"{path} is a TensorRT engine folder; name its tokenizer folder with --tokenizer",
                    "tokenizer")
        else:
            text = cfg.get("text_config", cfg)
            window = int(text.get("max_position_embeddings") or text.get("n_positions") or 2048)
            vocab, dtype = int(text["vocab_size"]), str(text.get("torch_dtype", ""))
            context_logits = True
        if max_model_len is not None:
            window = min(window, max_model_len)
        return cls(path=path, is_engine=is_engine, tokenizer_path=tokenizer or path,
                   context_window=window, vocab_size=vocab, dtype=dtype, context_logits=context_logits)
