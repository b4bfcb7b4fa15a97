"""GGUF checkpoints: convert a llama.cpp .gguf file once into an HF-style folder that load_model reads.

`resolve_gguf(path, dtype)` returns such a folder for a .gguf file (or a folder holding exactly one) and
any other path unchanged, so the loader, ModelSpec and Tokenizer need to know nothing about GGUF. The
folder (config.json, model.safetensors, generation_config.json, tokenizer files with the chat template)
is cached under $XDG_CACHE_HOME/trtllm-gateway/gguf/, keyed by the file's path, size and mtime and the
requested dtype: SmolLM2-135M Q4_1 converts in 26-33 s on a shared 2-core CPU, and the next start finds
it with one stat. Config, tokenizer and chat template come from the file's metadata through transformers
(`gguf_file=`); the `gguf` package dequantizes the weights; llama.cpp's Q/K row permutation is undone here, as are
its other changes: Gemma's norm weights stored plus one, Qwen3-MoE's experts stacked per layer (kept stacked, as
transformers 5 holds them), and the config facts transformers does not read from the metadata (Phi-3's LongRoPE
factors, stored as tensors; its sliding window; Gemma 3's RoPE scaling; Qwen3-MoE's expert width).
"""

from __future__ import annotations

import fcntl
import logging
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf
import torch
from gguf import GGUFReader, Keys
from gguf.quants import dequantize
from tqdm.auto import tqdm

from runtime.gguf_cache import (
    CacheFolderError,
    check_room,
    converted,
    converted_bytes,
    default_cache_dir,
    exact_dtype,
    gguf_file,
)
from runtime.model_spec import DEFAULT_ARCHITECTURES
from runtime.native.device import DTYPES

logger = logging.getLogger(__name__)

# GGUF general.architecture -> does llama.cpp's converter permute the Q/K rows of that architecture.
# Mistral checkpoints are converted as "llama".
_PERMUTES_QK: dict[str, bool] = {"llama": True, "qwen2": False, "qwen3": False, "qwen3moe": False, "gemma3": False,
                                 "phi3": False}

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
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",  # joined with ffn_up_exps into gate_up_proj (_join_experts)
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
# where an architecture's names differ from the Llama layout's (gguf's tensor_mapping.py)
_IN_BLOCK_OF: dict[str, dict[str, str]] = {
    "gemma3": {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_ROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")  # Phi-3's LongRoPE, as tensors


def resolve_gguf(path: str, dtype: str = "auto", cache_dir: Path | None = None) -> str:
    """The converted checkpoint folder for a .gguf file or a folder holding exactly one; other paths as given.

    dtype ("auto" | "bfloat16" | "float16" | "float32") is the weights' dtype in the folder; "auto" keeps
    the values exact: the file's half type for F16/BF16 files, float32 for quantized ones. cache_dir
    defaults to $XDG_CACHE_HOME (or ~/.cache)/trtllm-gateway/gguf.
    """
    found = gguf_file(Path(path))
    if found is None:
        return path
    root = cache_dir or default_cache_dir()
    done = converted(found, dtype, root)
    name = found.stem  # the served model name defaults to the checkpoint folder's name
    if done.is_dir():
        logger.debug("GGUF %s: using the checkpoint converted before, cached in %s", found, done / name)
        return str(done / name)
    with _converting(root):
        if done.is_dir():  # another process converted it while this one waited
            return str(done / name)
        return _convert_into(found, dtype, root, done, name)


@contextmanager
def _converting(root: Path) -> Iterator[None]:
    """One conversion at a time into the cache `root`, across processes: processes starting together on one file (a
    test suite's workers, servers started side by side) each converted it, where the later ones can wait for the
    first and take its folder. An flock, so a process killed while converting releases it."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        held = open(root / ".converting.lock", "a")  # noqa: SIM115 - held until the conversion ends
    except OSError:  # an unwritable cache: the conversion below says so
        yield
        return
    with held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def _convert_into(found: Path, dtype: str, root: Path, done: Path, name: str) -> str:
    """Convert `found` into the cache folder `done` (or alias an equal conversion cached under another dtype)."""
    reader = GGUFReader(found)  # parsed once (SmolLM2's 49k-token vocabulary takes ~3 s): sized, then converted
    same = _same_conversions(reader, found, dtype, root)
    for other in same:
        if other.is_dir():  # "auto" of a quantized file is "float32": converted under the other name before
            _alias(done, other)
            return str(other / name)
    needed = converted_bytes(reader, dtype)
    check_room(root, needed)
    if done.is_symlink():  # an alias whose folder was deleted: the rename below cannot replace it
        done.unlink()
    try:
        # written into a temporary folder and renamed, so a crash or a concurrent start never sees half a folder
        work = Path(tempfile.mkdtemp(prefix=f".{done.name}-", dir=root))
        try:
            started = time.perf_counter()
            stored = _convert(reader, found, work / name, dtype)
            try:
                work.rename(done)
            except OSError:  # another process finished the same conversion first
                if not done.is_dir():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    except OSError as exc:  # unwritable, full: one line that says what to do, not a traceback
        raise CacheFolderError(root, needed, exc.strerror or str(exc)) from None
    for other in same:
        _alias(other, done)
    logger.info("GGUF %s converted to %s checkpoint in %.1f s, cached in %s",
                found, stored, time.perf_counter() - started, done / name)
    return str(done / name)


def _same_conversions(reader: GGUFReader, gguf_file: Path, dtype: str, root: Path) -> list[Path]:
    """The cache folders of the other dtype requests that convert `gguf_file` to the same checkpoint as `dtype`:
    "auto" and the dtype it resolves to (a quantized file's "auto" is "float32")."""
    exact = exact_dtype(reader)
    requests = {"auto", exact} if dtype in ("auto", exact) else set()
    return [converted(gguf_file, other, root) for other in sorted(requests - {dtype})]


def _alias(alias: Path, folder: Path) -> None:
    """`alias` names `folder` (a link beside it in the cache) where it can: a later start asking for the other dtype
    then finds the checkpoint without parsing the file (a link another process made first, or an unwritable cache
    only cost that parse)."""
    try:
        alias.symlink_to(folder.name, target_is_directory=True)
    except OSError:
        pass


def _convert(reader: GGUFReader, gguf_file: Path, out: Path, dtype: str) -> str:
    """Write the HF-style checkpoint of `gguf_file` (`reader` parsed it) into `out`; return the weights' dtype
    name."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    architecture = str(reader.fields[Keys.General.ARCHITECTURE].contents())
    if architecture not in _PERMUTES_QK:
        raise ValueError(f"{gguf_file}: GGUF architecture {architecture!r} is not supported. "
                         f"Supported: {', '.join(_PERMUTES_QK)} (Mistral files are written as llama).")
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in SUPPORTED_TYPES:
            raise ValueError(f"{gguf_file}: tensor {tensor.name} has quantization type {tensor.tensor_type.name}, "
                             f"which is not supported. Supported types: {', '.join(SUPPORTED_TYPES)}.")
    with _read_once(reader, gguf_file):
        config = AutoConfig.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    target = DTYPES[exact_dtype(reader) if dtype == "auto" else dtype]

    tensors: dict[str, torch.Tensor] = {}
    rope_factors: dict[str, list[float]] = {}
    for tensor in tqdm(reader.tensors, desc=f"Converting {gguf_file.name}", unit="tensor"):
        if tensor.name in _ROPE_FACTORS:
            rope_factors[tensor.name] = dequantize(tensor.data, tensor.tensor_type).reshape(-1).tolist()
            continue
        hf_name = _hf_name(tensor.name, architecture)
        if hf_name is None:
            raise ValueError(f"{gguf_file}: tensor {tensor.name} has no counterpart in the {architecture} "
                             "checkpoints we load")
        weight = torch.tensor(dequantize(tensor.data, tensor.tensor_type), dtype=target)
        kind = tensor.name.split(".")[-2]  # "attn_q" in "blk.3.attn_q.weight"; biases are permuted too
        if _PERMUTES_QK[architecture] and kind in ("attn_q", "attn_k"):
            weight = _unpermute(weight, config.num_attention_heads if kind == "attn_q" else config.num_key_value_heads)
        if architecture == "gemma3" and "norm" in kind:
            weight = weight - 1  # llama.cpp stores Gemma's norm weights as the (1 + weight) they scale by
        tensors[hf_name] = weight
    _join_experts(tensors)
    _fix_config(reader, architecture, config, rope_factors)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    config.architectures = [DEFAULT_ARCHITECTURES[config.model_type]]
    config.dtype = target
    # what the file's layers were quantized to: the CPU serves them in the weight-only form that keeps them
    # (runtime/native/cpu/defaults.py)
    config.gguf_layer_types = sorted({t.tensor_type.name for t in reader.tensors
                                      if len(t.shape) > 1 and t.name.startswith("blk.")})
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    generation = GenerationConfig.from_model_config(config)
    generation.eos_token_id = _stop_ids(reader)
    generation.save_pretrained(out)
    return str(target).removeprefix("torch.")


@contextmanager
def _read_once(reader: GGUFReader, gguf_file: Path) -> Iterator[None]:
    """transformers' config and tokenizer loads of a GGUF file each parse its metadata again with gguf.GGUFReader
    (2.5 s each for SmolLM2's 49k-token vocabulary, on the 2-core box): hand them `reader`, which parsed it once
    (they only read it). Other files are parsed as before."""
    parse = gguf.GGUFReader
    wanted = gguf_file.resolve()
    gguf.GGUFReader = lambda path, *args, **kwargs: (  # type: ignore[misc]
        reader if Path(path).resolve() == wanted and not args and not kwargs else parse(path, *args, **kwargs))
    try:
        yield
    finally:
        gguf.GGUFReader = parse  # type: ignore[misc]


def _hf_name(gguf_name: str, architecture: str) -> str | None:
    base, _, suffix = gguf_name.rpartition(".")
    if base in _TOP_LEVEL:
        return f"{_TOP_LEVEL[base]}.{suffix}"
    match = _BLOCK_TENSOR.fullmatch(gguf_name)
    names = {**_IN_BLOCK, **_IN_BLOCK_OF.get(architecture, {})}
    if match and match[2] in names:
        return f"model.layers.{match[1]}.{names[match[2]]}.{match[3]}"
    return None


def _join_experts(tensors: dict[str, torch.Tensor]) -> None:
    """Stacked experts as transformers 5 (and our loader) name them: gate and up [E, I, H] joined into
    experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I], without ".weight"."""
    for name in [n for n in tensors if ".mlp.experts.gate_proj." in n]:
        prefix = name.removesuffix("gate_proj.weight")
        tensors[prefix + "gate_up_proj"] = torch.cat((tensors.pop(name), tensors.pop(prefix + "up_proj.weight")), 1)
        tensors[prefix + "down_proj"] = tensors.pop(prefix + "down_proj.weight")


def _field(reader: GGUFReader, key: str, architecture: str) -> Any:
    """The value of a metadata key ("{arch}.rope.scaling.type" templates filled with `architecture`), if present."""
    found = reader.fields.get(key.format(arch=architecture))
    return None if found is None else found.contents()


def _fix_config(reader: GGUFReader, architecture: str, config: Any, rope_factors: dict[str, list[float]]) -> None:
    """Set the config facts llama.cpp writes but transformers' GGUF reading skips (module docstring)."""
    key_length = _field(reader, Keys.Attention.KEY_LENGTH, architecture)
    if key_length and architecture != "phi3":  # an explicit head size (Qwen3's 128 is not hidden / heads)
        config.head_dim = int(key_length)
    if architecture == "qwen3moe":
        width = _field(reader, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, architecture)
        if width:
            config.moe_intermediate_size = int(width)
    if architecture == "phi3":
        window = _field(reader, Keys.Attention.SLIDING_WINDOW, architecture)
        config.sliding_window = int(window) if window else None
        head_dim = config.hidden_size // config.num_attention_heads
        rotary = _field(reader, Keys.Rope.DIMENSION_COUNT, architecture) or head_dim
        rope = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"],
                "partial_rotary_factor": int(rotary) / head_dim}
        if rope_factors:
            original = _field(reader, Keys.Rope.SCALING_ORIG_CTX_LEN, architecture) or config.max_position_embeddings
            rope |= {"rope_type": "longrope", "long_factor": rope_factors["rope_factors_long.weight"],
                     "short_factor": rope_factors["rope_factors_short.weight"],
                     "original_max_position_embeddings": int(original)}
            attn_factor = _field(reader, Keys.Rope.SCALING_ATTN_FACTOR, architecture)
            if attn_factor is not None:
                rope["attention_factor"] = float(attn_factor)
        config.rope_parameters = rope
    if architecture == "gemma3":
        # llama.cpp's query scale: 1/sqrt(head_dim), but 1/sqrt(hidden/heads) for the 62-layer 27B
        wide = config.num_hidden_layers == 62
        config.query_pre_attn_scalar = config.hidden_size // config.num_attention_heads if wide else config.head_dim
        if _field(reader, Keys.Rope.SCALING_TYPE, architecture) == "linear":
            factor = float(_field(reader, Keys.Rope.SCALING_FACTOR, architecture))
            config.rope_parameters["full_attention"].update(rope_type="linear", factor=factor)


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


def main(argv: list[str] | None = None) -> int:
    """Convert one GGUF file into its cached checkpoint folder, in a process of its own (runtime/served_model.py:
    the front end never loads torch); the error, if any, on stderr's last line."""
    import argparse

    parser = argparse.ArgumentParser(description="Convert a GGUF file into the cached checkpoint folder served from it")
    parser.add_argument("path")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--build-cpu-kernels", action="store_true",
                        help="also build the CPU kernels meanwhile (unless a GPU serves), so that a first start pays "
                             "for the two at once: the compiler runs in its own processes beside the conversion")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    build = None
    if args.build_cpu_kernels and not torch.cuda.is_available():
        from runtime.native.cpu.paged_attention import build_kernel

        build = threading.Thread(target=build_kernel, name="cpu-kernels")
        build.start()
    try:
        print(resolve_gguf(args.path, args.dtype))
    except (OSError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        if build is not None:
            build.join()  # the engine core then loads them from the build folder
    return 0


if __name__ == "__main__":
    sys.exit(main())
