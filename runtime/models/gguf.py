"""GGUF checkpoints: convert a llama.cpp .gguf file once into an HF-style folder that load_model reads.

`resolve_gguf(path, dtype)` returns such a folder for a .gguf file (or a folder holding exactly one) and
any other path unchanged, so the loader, ModelSpec and Tokenizer need to know nothing about GGUF. The
folder (config.json, model.safetensors, generation_config.json, tokenizer files with the chat template)
is cached under $XDG_CACHE_HOME/trtllm-gateway/gguf/, keyed by the file's path, size and mtime and the
requested dtype: SmolLM2-135M Q4_1 converts in 26-33 s on a shared 2-core CPU, and the next start finds
it with one stat. Config, tokenizer and chat template come from the file's metadata through transformers
(`gguf_file=`); the `gguf` package dequantizes the weights; llama.cpp's Q/K row permutation is undone here.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import torch
from gguf import GGUFReader, Keys
from gguf.quants import dequantize
from tqdm.auto import tqdm

from runtime.cache import cache_folder
from runtime.device import DTYPES

logger = logging.getLogger(__name__)

# GGUF general.architecture -> does llama.cpp's converter permute the Q/K rows of that architecture.
# Mistral checkpoints are converted as "llama".
_PERMUTES_QK: dict[str, bool] = {"llama": True, "qwen2": False}

# transformers' model_type (as read from the file) -> our registry's architecture name
_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}

# the float and block types whose dequantization is tested in tests/unit/test_gguf.py
SUPPORTED_TYPES: tuple[str, ...] = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
)

_TOP_LEVEL: dict[str, str] = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_IN_BLOCK: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

# bump when the converted folder's contents change, so older caches are not reused
_FORMAT_VERSION = 1


def resolve_gguf(path: str, dtype: str = "auto", cache_dir: Path | None = None) -> str:
    """The converted checkpoint folder for a .gguf file or a folder holding exactly one; other paths as given.

    dtype ("auto" | "bfloat16" | "float16" | "float32") is the weights' dtype in the folder; "auto" keeps
    the values exact: the file's half type for F16/BF16 files, float32 for quantized ones. cache_dir
    defaults to $XDG_CACHE_HOME (or ~/.cache)/trtllm-gateway/gguf.
    """
    gguf_file = _gguf_file(Path(path))
    if gguf_file is None:
        return path
    if dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r} (use auto, {', '.join(DTYPES)})")
    root = cache_dir or _default_cache_dir()
    stat = gguf_file.stat()
    key = hashlib.sha256(
        f"{gguf_file.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0{dtype}\0{_FORMAT_VERSION}".encode()
    ).hexdigest()[:16]
    name = gguf_file.stem  # the served model name defaults to the checkpoint folder's name
    done = root / key
    if done.is_dir():
        logger.debug("GGUF %s: using the checkpoint converted before, cached in %s", gguf_file, done / name)
        return str(done / name)
    needed = _converted_bytes(gguf_file, dtype)
    try:
        _check_room(root, needed)
        # written into a temporary folder and renamed, so a crash or a concurrent start never sees half a folder
        work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        try:
            started = time.perf_counter()
            stored = _convert(gguf_file, work / name, dtype)
            try:
                work.rename(done)
            except OSError:  # another process finished the same conversion first
                if not done.is_dir():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    except OSError as exc:  # unwritable, full: one line that says what to do, not a traceback
        raise CacheFolderError(root, needed, exc.strerror or str(exc)) from None
    logger.info("GGUF %s converted to %s checkpoint in %.1f s, cached in %s",
                gguf_file, stored, time.perf_counter() - started, done / name)
    return str(done / name)


class CacheFolderError(ValueError):
    """The converted checkpoint cannot be written to the cache folder (a start-up error of one line)."""

    def __init__(self, root: Path, needed: int, reason: str) -> None:
        super().__init__(f"cannot write the converted GGUF checkpoint to {root}: {reason}; it needs about "
                         f"{-(-needed // 2**20)} MiB free there. Set XDG_CACHE_HOME to a writable folder with room "
                         "(the cache is $XDG_CACHE_HOME/trtllm-gateway/gguf, by default under ~/.cache).")


def _check_room(root: Path, needed: int) -> None:
    """OSError when `root` cannot be made or holds less than `needed` bytes free."""
    root.mkdir(parents=True, exist_ok=True)
    if not os.access(root, os.W_OK | os.X_OK):
        raise PermissionError(13, "Permission denied")
    free = shutil.disk_usage(root).free
    if free < needed:
        raise OSError(28, f"only {free // 2**20} MiB free")


def _converted_bytes(gguf_file: Path, dtype: str) -> int:
    """About the size of the converted checkpoint: its weights in the target dtype, and a margin for the rest."""
    reader = GGUFReader(gguf_file)
    target = DTYPES[dtype] if dtype != "auto" else _exact_dtype(reader)
    weights = sum(int(t.n_elements) for t in reader.tensors) * target.itemsize
    return weights + gguf_file.stat().st_size // 10 + 16 * 2**20  # tokenizer files, config


def _gguf_file(path: Path) -> Path | None:
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"no such GGUF file: {path}")
        return path
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(f"{path} holds {len(found)} .gguf files ({', '.join(f.name for f in found)}); "
                         "pass the one to serve")
    return found[0] if found else None


def _default_cache_dir() -> Path:
    return cache_folder("gguf")


def _convert(gguf_file: Path, out: Path, dtype: str) -> str:
    """Write the HF-style checkpoint of `gguf_file` into `out`; return the weights' dtype name."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    reader = GGUFReader(gguf_file)
    architecture = str(reader.fields[Keys.General.ARCHITECTURE].contents())
    if architecture not in _PERMUTES_QK:
        raise ValueError(f"{gguf_file}: GGUF architecture {architecture!r} is not supported. "
                         f"Supported: {', '.join(_PERMUTES_QK)} (Mistral files are written as llama).")
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in SUPPORTED_TYPES:
            raise ValueError(f"{gguf_file}: tensor {tensor.name} has quantization type {tensor.tensor_type.name}, "
                             f"which is not supported. Supported types: {', '.join(SUPPORTED_TYPES)}.")
    config = AutoConfig.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    target = DTYPES[dtype] if dtype != "auto" else _exact_dtype(reader)

    tensors: dict[str, torch.Tensor] = {}
    for tensor in tqdm(reader.tensors, desc=f"Converting {gguf_file.name}", unit="tensor"):
        hf_name = _hf_name(tensor.name)
        if hf_name is None:
            raise ValueError(f"{gguf_file}: tensor {tensor.name} has no counterpart in the {architecture} "
                             "checkpoints we load")
        weight = torch.tensor(dequantize(tensor.data, tensor.tensor_type), dtype=target)
        kind = tensor.name.split(".")[-2]  # "attn_q" in "blk.3.attn_q.weight"; biases are permuted too
        if _PERMUTES_QK[architecture] and kind in ("attn_q", "attn_k"):
            weight = _unpermute(weight, config.num_attention_heads if kind == "attn_q" else config.num_key_value_heads)
        tensors[hf_name] = weight
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    config.architectures = [_ARCHITECTURES[config.model_type]]
    config.dtype = target
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    generation = GenerationConfig.from_model_config(config)
    generation.eos_token_id = _stop_ids(reader)
    generation.save_pretrained(out)
    return str(target).removeprefix("torch.")


def _exact_dtype(reader: GGUFReader) -> torch.dtype:
    """The dtype that holds every weight value exactly: a half type when all matrices use it, else float32."""
    matrix_types = {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1}
    if matrix_types == {"F16"}:
        return torch.float16
    if matrix_types == {"BF16"}:
        return torch.bfloat16
    return torch.float32


def _hf_name(gguf_name: str) -> str | None:
    base, _, suffix = gguf_name.rpartition(".")
    if base in _TOP_LEVEL:
        return f"{_TOP_LEVEL[base]}.{suffix}"
    match = _BLOCK_TENSOR.fullmatch(gguf_name)
    if match and match[2] in _IN_BLOCK:
        return f"model.layers.{match[1]}.{_IN_BLOCK[match[2]]}.{match[3]}"
    return None


def _unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf.py's `permute`, which interleaves each head's two rotary halves (the HF
    rotate_half layout) into pairs (GGML's RoPE layout): rows (head, pair, 2) back to (head, 2, pair)."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def _stop_ids(reader: GGUFReader) -> list[int] | None:
    """eos plus the other end-of-generation ids llama.cpp stops on (end of turn, end of message)."""
    ids: list[int] = []
    for key in (Keys.Tokenizer.EOS_ID, Keys.Tokenizer.EOT_ID, Keys.Tokenizer.EOM_ID):
        field = reader.fields.get(key)
        if field is not None and int(field.contents()) not in ids:
            ids.append(int(field.contents()))
    return ids or None
