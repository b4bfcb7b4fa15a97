"""Tiny random-weight Hugging Face checkpoints (and a tiny tokenizer) for tests.

`build_tiny_model(root, "llama")` writes config.json, safetensors weights, generation_config.json and a
byte-level BPE tokenizer (ChatML chat template) into a folder under `root` and returns it. Builds are
cached per process, keyed by every argument, so repeated fixtures cost nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

TINY_ARCHITECTURES = ("llama", "llama3", "llama-untied", "mistral", "qwen2", "gpt2")
# the families of issue 43, each as its own transformers config class builds it (_family_config)
FAMILIES = ("qwen3", "gemma3", "phi3", "mixtral", "qwen3_moe", "gpt_oss")
SLIDING_WINDOW = 8  # tiny windows, so that prompts and generations cross them

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOKENIZER_VOCAB_SIZE = 300  # 256 byte symbols + 3 specials + 41 merges

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# a fixed corpus keeps the learned merges (and so every token id) deterministic
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! Hello there, how are you today?",
    "the cat sat on the mat and the dog sat on the log",
    "In the beginning there was the word, and the word was tokenized.",
    "A tiny model for tests: hello hello hello world world world.",
] * 4

_BUILT: dict[tuple[Any, ...], Path] = {}


def train_byte_level_bpe(corpus: list[str], vocab_size: int = TOKENIZER_VOCAB_SIZE, **roles: str) -> Any:
    """A byte-level BPE (GPT-2/Llama-3/Qwen style) trained on `corpus`, with SPECIAL_TOKENS, as a
    PreTrainedTokenizerFast; `roles` name its special tokens (eos_token="<|endoftext|>", ...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, additional_special_tokens=["<|im_start|>", "<|im_end|>"],
                                   **roles)


def build_tiny_tokenizer(folder: Path) -> Any:
    """Train and save a deterministic byte-level BPE tokenizer (PreTrainedTokenizerFast) into `folder`."""
    hf = train_byte_level_bpe(_CORPUS, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                              pad_token="<|endoftext|>")
    hf.chat_template = CHATML_TEMPLATE
    hf.save_pretrained(folder)
    return hf


def bannable_token(tokenizer: Any, ids: list[int]) -> tuple[int, str]:
    """The first of `ids` that bad_words=[its text] bans (a runtime.tokenizer.Tokenizer), and that text."""
    for token in ids:
        word = tokenizer.decode([token]).strip()
        if word and [token] in tokenizer.bad_words_ids([word]):
            return token, word
    raise ValueError(f"no token of {ids} is banned by its own text")


def _family_config(arch: str, vocab_size: int, ids: dict[str, int], overrides: dict[str, Any]) -> Any:
    """A tiny config of one of FAMILIES: hidden 64, 4 heads over 2 KV heads of 16 dims, 2-3 layers."""
    from transformers import Gemma3TextConfig, GptOssConfig, MixtralConfig, Phi3Config, Qwen3Config, Qwen3MoeConfig

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256, **ids)
    if arch == "qwen3":
        kwargs: dict[str, Any] = dict(tie_word_embeddings=True)
        cls: Any = Qwen3Config
    elif arch == "gemma3":  # two sliding layers, then a global one, as Gemma 3's 5:1 pattern in short
        kwargs = dict(num_hidden_layers=3, query_pre_attn_scalar=16, sliding_window=SLIDING_WINDOW,
                      layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                      final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh")
        cls = Gemma3TextConfig
    elif arch == "phi3":  # Phi-4-mini's shape in small: LongRoPE, a quarter of each head not rotated
        rotary_half = 6  # 16 dims * 0.75 / 2
        kwargs = dict(tie_word_embeddings=False, original_max_position_embeddings=64,
                      rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                       "short_factor": [1.0 + 0.1 * i for i in range(rotary_half)],
                                       "long_factor": [2.0 + 0.5 * i for i in range(rotary_half)],
                                       "original_max_position_embeddings": 64})
        cls = Phi3Config
    elif arch == "mixtral":
        kwargs = dict(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                      tie_word_embeddings=False)
        cls = MixtralConfig
    elif arch == "qwen3_moe":  # 8 experts of 32, the second layer dense (mlp_only_layers)
        kwargs = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                      mlp_only_layers=[1], tie_word_embeddings=False)
        cls = Qwen3MoeConfig
    elif arch == "gpt_oss":  # sliding and full layers alternating, YaRN, sinks, 4 experts with biases
        kwargs = dict(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=SLIDING_WINDOW,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                       "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64},
                      tie_word_embeddings=False)
        cls = GptOssConfig
    else:
        raise ValueError(arch)
    return cls(**{**common, **kwargs, **overrides})


def _config(arch: str, vocab_size: int, special: dict[str, int], overrides: dict[str, Any]) -> Any:
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    ids = {"bos_token_id": special["<|endoftext|>"], "eos_token_id": special["<|endoftext|>"],
           "pad_token_id": special["<|endoftext|>"]}
    if arch in FAMILIES:
        return _family_config(arch, vocab_size, ids, overrides)
    if arch == "gpt2":
        kwargs = dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, **ids)
        return GPT2Config(vocab_size=vocab_size, **{**kwargs, **overrides})
    llama_like = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, **ids)
    if arch == "llama3":
        llama_like["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
        llama_like["rope_theta"] = 500000.0
    cls = {"llama": LlamaConfig, "llama3": LlamaConfig, "llama-untied": LlamaConfig,
           "mistral": MistralConfig, "qwen2": Qwen2Config}[arch]
    llama_like["tie_word_embeddings"] = arch not in ("llama-untied", "mistral")
    return cls(vocab_size=vocab_size, **{**llama_like, **overrides})


def build_tiny_model(
    root: Path,
    arch: str = "llama",
    *,
    dtype: torch.dtype = torch.float32,
    shard: bool = False,
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """Write a tiny random checkpoint of `arch` (one of TINY_ARCHITECTURES) under `root`; return its folder.

    dtype: the weights' dtype on disk; shard: split the weights into several files with an index;
    overrides: config fields (e.g. num_hidden_layers=1, head_dim=32). vocab_size always equals the
    tokenizer's size (300). FAMILIES are accepted too.
    """
    from transformers import AutoModelForCausalLM, GenerationConfig

    if arch not in TINY_ARCHITECTURES + FAMILIES:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose from {TINY_ARCHITECTURES + FAMILIES}")
    key = (str(root), arch, dtype, shard, seed, json.dumps(overrides, sort_keys=True, default=str))
    if key in _BUILT and _BUILT[key].exists():
        return _BUILT[key]
    dtype_name = str(dtype).removeprefix("torch.")
    folder = Path(root) / f"tiny-{arch}-{dtype_name}{'-sharded' if shard else ''}-s{seed}-{len(_BUILT)}"
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(folder)
    special = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = _config(arch, len(tokenizer), special, overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # random init with std 0.02 gives near-uniform logits and greedy output that repeats one token;
    # larger weights give varied, decisive greedy choices, so comparisons exercise the model
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 1.0 if "emb" in name or "wte" in name or "wpe" in name else 0.2)
    model = model.to(dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=special["<|endoftext|>"],
        eos_token_id=[special["<|endoftext|>"], special["<|im_end|>"]],
        pad_token_id=special["<|endoftext|>"],
    )
    model.save_pretrained(folder, max_shard_size="40KB" if shard else "10GB")
    _BUILT[key] = folder
    return folder
