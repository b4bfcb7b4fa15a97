"""Our model definitions against transformers' reference, through the paged KV cache."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.architectures import UnsupportedArchitectureError
from runtime.native.attention_metadata import AttentionMetadata
from runtime.model_spec import ModelSpec, RopeConfig
from runtime.native.models import CausalLM, allocate_kv_cache, kv_cache_bytes_per_token, load_model
from tests.tiny_models import FAMILIES, TINY_ARCHITECTURES, build_tiny_model

BLOCK_SIZE = 4
PROMPT = [5, 77, 123, 9, 250, 31, 64, 200, 17, 42, 99, 3, 150]
OTHER_PROMPT = [11, 12, 260, 14, 15, 80, 7]


class PagedRunner:
    """A minimal model runner: packs steps into AttentionMetadata over blocks handed out out of order; the cache, ids
    and metadata on the model's device (a CUDA model's kernels index with them)."""

    def __init__(self, model: CausalLM, num_blocks: int = 64, seed: int = 0) -> None:
        self.model = model
        weight = next(model.parameters())
        self.device = weight.device
        self.kv_caches = allocate_kv_cache(model.spec, num_blocks, BLOCK_SIZE, weight.dtype, self.device)
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)  # sequences get scattered, non-contiguous blocks
        self.tables: dict[str, list[int]] = {}
        self.lens: dict[str, int] = {}

    def step(self, chunks: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """Run one packed step; returns each chunk's float32 logits [len(chunk), vocab]."""
        ids, positions, slots, tables = [], [], [], []
        query_lens, seq_lens, context_lens = [], [], []
        for seq, tokens in chunks:
            table = self.tables.setdefault(seq, [])
            ctx = self.lens.get(seq, 0)
            total = ctx + len(tokens)
            while len(table) * BLOCK_SIZE < total:
                table.append(self.free.pop())
            for pos in range(ctx, total):
                positions.append(pos)
                slots.append(table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
            ids += tokens
            tables.append(table)
            query_lens.append(len(tokens))
            seq_lens.append(total)
            context_lens.append(ctx)
            self.lens[seq] = total
        width = max(len(t) for t in tables)
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)

        def tensor(values: list, dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        meta = AttentionMetadata(
            query_start_loc=tensor(starts, torch.int32),
            context_lens=tensor(context_lens, torch.int32),
            seq_lens=tensor(seq_lens, torch.int32),
            block_tables=tensor([t + [0] * (width - len(t)) for t in tables], torch.int32),
            slot_mapping=tensor(slots),
            block_size=BLOCK_SIZE,
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_lens_host=query_lens,
            seq_lens_host=seq_lens,
        )
        with torch.inference_mode():
            hidden = self.model(tensor(ids), tensor(positions), self.kv_caches, meta)
            logits = self.model.compute_logits(hidden)
        return list(logits.split(query_lens))

    def greedy(self, seq: str, prompt: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
        out = [int(self.step([(seq, prompt)])[0][-1].argmax())]
        while len(out) < max_new_tokens and out[-1] not in eos:
            out.append(int(self.step([(seq, [out[-1]])])[0][-1].argmax()))
        return out


@pytest.fixture(scope="session")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


def _hf(path: Path, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def _hf_logits(path: Path, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return _hf(path)(torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES + FAMILIES)
def test_prefill_logits_match_transformers(models_root: Path, arch: str) -> None:
    path = build_tiny_model(models_root, arch)
    # Phi-3's LongRoPE: short factors for a context within its original window (test_model_families.py: long ones)
    model = load_model(str(path), None, torch.device("cpu"), 64 if arch == "phi3" else None)
    prompt = PROMPT + OTHER_PROMPT  # 20 tokens: longer than the families' sliding window (8)
    (logits,) = PagedRunner(model).step([("a", prompt)])
    assert logits.dtype == torch.float32
    assert logits.shape == (len(prompt), 300)
    torch.testing.assert_close(logits, _hf_logits(path, prompt), atol=1e-4, rtol=1e-4)


def test_rope_scaling_variants_match_transformers(models_root: Path) -> None:
    """Linear RoPE scaling and an explicit head_dim (q/k/v wider than hidden/heads) follow the config."""
    for overrides in ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, {"head_dim": 32}):
        path = build_tiny_model(models_root, "llama", **overrides)
        (logits,) = PagedRunner(load_model(str(path), None, "cpu")).step([("a", PROMPT)])
        torch.testing.assert_close(logits, _hf_logits(path, PROMPT), atol=1e-4, rtol=1e-4)


def test_rope_config_reads_pre_v5_spelling() -> None:
    """Older checkpoints put rope_theta at the top level and the scaling under rope_scaling["type"]."""
    rope = RopeConfig.from_config({"rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 4.0}})
    assert (rope.theta, rope.rope_type, rope.params["factor"]) == (500000.0, "linear", 4.0)
    assert RopeConfig.from_config({}).rope_type == "default"


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_greedy_decode_matches_generate(models_root: Path, arch: str) -> None:
    """Two sequences decode together in batched decode steps; each equals HF greedy generate."""
    path = build_tiny_model(models_root, arch)
    model = load_model(str(path), None, "cpu")
    eos = set(model.spec.eos_token_ids)
    hf = _hf(path)
    expected = {}
    for seq, prompt in (("a", PROMPT), ("b", OTHER_PROMPT)):
        with torch.inference_mode():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)
        expected[seq] = out[0, len(prompt):].tolist()
    runner = PagedRunner(model)
    logits_a, logits_b = runner.step([("a", PROMPT), ("b", OTHER_PROMPT)])
    got = {"a": [int(logits_a[-1].argmax())], "b": [int(logits_b[-1].argmax())]}
    live = [s for s in got if got[s][-1] not in eos]
    while live:
        step = runner.step([(s, [got[s][-1]]) for s in live])
        for s, logits in zip(live, step):
            got[s].append(int(logits[-1].argmax()))
        live = [s for s in live if got[s][-1] not in eos and len(got[s]) < 20]
    assert got == expected
    assert max(len(v) for v in got.values()) == 20  # the comparison covered real decoding, not an early stop
    assert runner.lens["a"] > 4 * BLOCK_SIZE  # the sequence spans several blocks


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_mixed_step_equals_separate_runs(models_root: Path, arch: str) -> None:
    """One packed step holding a decode token of one sequence and the prompt of another."""
    model = load_model(str(build_tiny_model(models_root, arch)), None, "cpu")
    separate = PagedRunner(model, seed=1)
    separate.step([("a", PROMPT)])
    decode_alone = separate.step([("a", [7])])[0]
    prefill_alone = PagedRunner(model, seed=2).step([("b", OTHER_PROMPT)])[0]

    packed = PagedRunner(model, seed=3)
    packed.step([("a", PROMPT)])
    decode, prefill = packed.step([("a", [7]), ("b", OTHER_PROMPT)])
    torch.testing.assert_close(decode, decode_alone, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(prefill, prefill_alone, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama3", "qwen2", "gpt2", "gemma3", "gpt_oss"])
def test_chunked_prefill_equals_single_prefill(models_root: Path, arch: str) -> None:
    """A prompt fed in chunks (query_len > 1 over cached context, as speculative scoring does) changes nothing."""
    model = load_model(str(build_tiny_model(models_root, arch)), None, "cpu")
    (whole,) = PagedRunner(model).step([("a", PROMPT)])
    chunked = PagedRunner(model, seed=5)
    first = chunked.step([("a", PROMPT[:5])])[0]
    second = chunked.step([("a", PROMPT[5:])])[0]
    torch.testing.assert_close(torch.cat([first, second]), whole, atol=1e-4, rtol=1e-4)
    # and a decode of the chunked sequence batched with a 3-token "speculative" query of another
    batched = chunked.step([("a", [1]), ("b", OTHER_PROMPT[:3])])
    reference = PagedRunner(model, seed=6)
    reference.step([("a", PROMPT)])
    torch.testing.assert_close(batched[0], reference.step([("a", [1])])[0], atol=1e-4, rtol=1e-4)


def test_experts_stacked_as_transformers_5_holds_them_load_too(models_root: Path, tmp_path: Path) -> None:
    """Hub checkpoints give Mixtral's and Qwen3-MoE's experts one tensor each; transformers 5's own state dict stacks
    them (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]): both load to the same model."""
    path = build_tiny_model(models_root, "qwen3_moe")
    stacked = tmp_path / "stacked"
    shutil.copytree(path, stacked)
    state = {name: t.contiguous() for name, t in _hf(path).state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    (stacked / "model.safetensors").unlink()
    save_file(state, str(stacked / "model.safetensors"))
    per_expert, fused = (load_model(str(p), None, "cpu") for p in (path, stacked))
    for (name, a), (_, b) in zip(per_expert.named_parameters(), fused.named_parameters()):
        assert torch.equal(a, b), name


def test_gemma3_multimodal_checkpoint_serves_its_text_model(tmp_path: Path) -> None:
    """Gemma 3 4B and larger ship as Gemma3ForConditionalGeneration: its text model (under language_model) loads
    and gives transformers' logits for text; the vision tower's weights are skipped."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, SiglipVisionConfig

    from tests.tiny_models import _family_config

    text = _family_config("gemma3", 300, {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}, {})
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    config = Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                          image_token_index=299, boi_token_index=297, eoi_token_index=298)
    torch.manual_seed(0)
    hf = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 1.0 if "emb" in name else 0.2)
    hf.save_pretrained(tmp_path / "gemma3-mm")
    ours = load_model(str(tmp_path / "gemma3-mm"), torch.float32)
    prompt = PROMPT + OTHER_PROMPT
    with torch.inference_mode():
        expected = hf(input_ids=torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(PagedRunner(ours).step([("a", prompt)])[0], expected, atol=1e-4, rtol=1e-4)


def test_sharded_bf16_checkpoint_loads(models_root: Path) -> None:
    path = build_tiny_model(models_root, "llama-untied", dtype=torch.bfloat16, shard=True)
    assert len(list(path.glob("model-*.safetensors"))) > 1
    as_stored = load_model(str(path), None, "cpu")
    assert as_stored.spec.dtype == "bfloat16"
    assert {p.dtype for p in as_stored.parameters()} == {torch.bfloat16}
    # upcast on load: equals transformers running the same bf16 weights in float32
    upcast = load_model(str(path), torch.float32, "cpu")
    (logits,) = PagedRunner(upcast).step([("a", PROMPT)])
    torch.testing.assert_close(logits, _hf_logits(path, PROMPT), atol=1e-4, rtol=1e-4)
    (bf16_logits,) = PagedRunner(as_stored).step([("a", PROMPT)])
    assert bf16_logits.dtype == torch.float32
    assert (bf16_logits.argmax(-1) == logits.argmax(-1)).float().mean() > 0.8


def test_fp16_checkpoint_keeps_its_dtype(models_root: Path) -> None:
    model = load_model(str(build_tiny_model(models_root, "gpt2", dtype=torch.float16)), None, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float16}


def test_gpt2_checkpoint_without_transformer_prefix(models_root: Path, tmp_path: Path) -> None:
    """The original "gpt2" checkpoints name tensors "h.0.attn..." rather than "transformer.h.0.attn..."."""
    source = build_tiny_model(models_root, "gpt2")
    target = tmp_path / "gpt2-bare"
    shutil.copytree(source, target)
    tensors = load_file(str(target / "model.safetensors"))
    save_file({k.removeprefix("transformer."): v for k, v in tensors.items()}, str(target / "model.safetensors"))
    (logits,) = PagedRunner(load_model(str(target), None, "cpu")).step([("a", PROMPT)])
    torch.testing.assert_close(logits, _hf_logits(source, PROMPT), atol=1e-4, rtol=1e-4)


def test_unsupported_architecture_names_supported_ones(models_root: Path, tmp_path: Path) -> None:
    target = tmp_path / "falcon"
    shutil.copytree(build_tiny_model(models_root, "llama"), target)
    config = json.loads((target / "config.json").read_text())
    config["architectures"] = ["FalconForCausalLM"]
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError) as info:
        load_model(str(target), None, "cpu")
    assert str(info.value) == (
        "Unsupported model architecture 'FalconForCausalLM'. Supported architectures: "
        "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, "
        "Gemma3ForConditionalGeneration, Phi3ForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM, "
        "GptOssForCausalLM, GPT2LMHeadModel."
    )
    assert isinstance(info.value, ValueError)
    config["architectures"] = ["LlamaForCausalLM"]
    config["rope_parameters"] = {"rope_type": "mrope", "rope_theta": 10000.0}
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="rope type 'mrope' is not supported"):
        load_model(str(target), None, "cpu")
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match=r"not supported: quantized checkpoints"):
        load_model(str(target), None, "cpu")


def test_spec_and_kv_cache_layout(models_root: Path) -> None:
    spec = ModelSpec.from_pretrained(build_tiny_model(models_root, "llama"))
    assert (spec.architecture, spec.vocab_size, spec.hidden_size, spec.num_layers) == ("LlamaForCausalLM", 300, 64, 2)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.max_position_embeddings) == (4, 2, 16, 256)
    assert spec.eos_token_ids == [0, 2]  # config's <|endoftext|>, then generation_config's <|im_end|>
    assert spec.bos_token_id == 0
    caches = allocate_kv_cache(spec, 10, BLOCK_SIZE, torch.bfloat16, "cpu")
    assert len(caches) == 2 and caches[0].shape == (2, 10, BLOCK_SIZE, 2, 16) and caches[0].dtype == torch.bfloat16
    assert kv_cache_bytes_per_token(spec, torch.bfloat16) == 2 * 2 * 2 * 16 * 2
    gpt2 = ModelSpec.from_pretrained(build_tiny_model(models_root, "gpt2"))
    assert (gpt2.num_heads, gpt2.num_kv_heads, gpt2.head_dim, gpt2.max_position_embeddings) == (4, 4, 16, 256)


def test_linear_delta_applies_to_one_fused_part(models_root: Path) -> None:
    """The LoRA seam: a delta on the fused qkv projection can target v_proj alone, like PEFT on v_proj."""
    path = build_tiny_model(models_root, "llama")
    model = load_model(str(path), None, "cpu")
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.part_names == ("q_proj", "k_proj", "v_proj") and qkv.part_sizes == (64, 32, 32)
    torch.manual_seed(0)
    lora_a, lora_b = torch.randn(4, 64) * 0.1, torch.randn(32, 4) * 0.1
    start, size = qkv.part_range("v_proj")

    def delta(x: torch.Tensor, linear: torch.nn.Module) -> torch.Tensor:
        y = torch.nn.functional.linear(x, linear.weight, linear.bias)
        y[:, start:start + size] += x @ lora_a.T @ lora_b.T
        return y

    qkv.delta = delta
    (logits,) = PagedRunner(model).step([("a", PROMPT)])
    hf = _hf(path)
    with torch.no_grad():
        hf.model.layers[0].self_attn.v_proj.weight += lora_b @ lora_a
        expected = hf(torch.tensor([PROMPT])).logits[0]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_forward_without_cache_for_warmup(models_root: Path) -> None:
    """kv_caches=[] (profiling / warm-up runs before the cache exists) works for fresh prompts."""
    model = load_model(str(build_tiny_model(models_root, "qwen2")), None, "cpu")
    runner = PagedRunner(model)
    (paged,) = runner.step([("a", PROMPT)])
    runner.kv_caches = []
    runner.lens.clear()
    (uncached,) = runner.step([("b", PROMPT)])
    torch.testing.assert_close(uncached, paged, atol=1e-5, rtol=1e-5)


def test_tiny_tokenizer_matches_model(models_root: Path) -> None:
    from transformers import AutoTokenizer

    path = build_tiny_model(models_root, "gpt2")
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == ModelSpec.from_pretrained(path).vocab_size == 300
    assert tok.eos_token == "<|endoftext|>" and tok.convert_tokens_to_ids("<|im_end|>") == 2
    assert tok.decode(tok.encode("Hello, world!")) == "Hello, world!"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def _mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenAI's MXFP4 of weight [..., K] (K a multiple of 32): blocks uint8 [..., K/32, 16] (two e2m1 codes a byte,
    low nibble first) and scales uint8 [..., K/32] (2^(s - 127)); each group's largest value maps to at most 6."""
    from runtime.native.models.gpt_oss import FP4_VALUES

    groups = weight.float().unflatten(-1, (-1, 32))
    exponent = torch.ceil(torch.log2(groups.abs().amax(-1).clamp(min=1e-30) / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)[..., None]
    magnitudes = torch.tensor(FP4_VALUES[:8])
    codes = (scaled.abs()[..., None] - magnitudes).abs().argmin(-1) | ((scaled < 0).long() << 3)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return blocks, (exponent + 127).to(torch.uint8)


async def test_gpt_oss_mxfp4_checkpoint_dequantizes_as_transformers(models_root: Path, tmp_path: Path) -> None:
    """OpenAI's gpt-oss files hold the experts as MXFP4 blocks and scales: they load to the weights transformers'
    own dequantization (integrations/mxfp4.py) gives, and the engine serves them with transformers' greedy ids."""
    from tests.engine_harness import collect, hf_greedy, load_hf, request, running_engine

    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    path = build_tiny_model(models_root, "gpt_oss")
    weights = load_file(path / "model.safetensors")
    quantized, dequantized = dict(weights), dict(weights)
    for name in [n for n in weights if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = _mxfp4(weights[name].transpose(1, 2))  # the files store [E, out, in]
        del quantized[name]
        quantized[name + "_blocks"], quantized[name + "_scales"] = blocks, scales
        dequantized[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # transformers' [E, in, out]
    for folder, tensors, extra in ((tmp_path / "mxfp4", quantized, {"quantization_config": {"quant_method": "mxfp4"}}),
                                   (tmp_path / "plain", dequantized, {})):
        shutil.copytree(path, folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **extra}))
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    ours, reference = (load_model(str(tmp_path / f), torch.float32) for f in ("mxfp4", "plain"))
    for (name, got), (_, want) in zip(ours.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.equal(got, want), name
    assert not torch.equal(ours.model.layers[0].mlp.experts.down_proj, load_model(str(path)).model.layers[0].mlp
                           .experts.down_proj)  # the 4-bit values really are other values
    async with running_engine(tmp_path / "mxfp4") as engine:
        out = await collect(engine, request("mxfp4", PROMPT, 12))
    assert out.tokens[0] == hf_greedy(load_hf(tmp_path / "plain"), PROMPT, 12)
