"""--quantization fp8 through the HTTP server: a 16-bit checkpoint served with its projections quantized at load to
E4M3 per output channel gives, on /v1/completions, transformers' greedy ids over those E4M3 weights (on the CPU the
engine serves them dequantized; on an H100/H200 on the FP8 tensor cores); an AWQ INT4 checkpoint likewise gives the
greedy ids of its dequantized weights; an FP8 checkpoint with KV-cache scales served with --kv-cache-dtype fp8 gives
the ids of its dequantized weights over a cache rounded through those scales."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
from safetensors.torch import load_file, save_file

from tests.e2e.conftest import MODEL_NAME, launch
from tests.engine_harness import hf_greedy, hf_greedy_fp8, load_hf
from tests.fp8_checkpoints import PROJECTION, amplify_kv, kv_scales_for, to_e4m3, write_fp8_checkpoint
from tests.int4_checkpoints import write_int4_checkpoint

PROMPT = [7, 99, 31, 250, 4, 18]


def _served_greedy(model_dir: Path, want: list[int], **engine_options: object) -> dict:
    """/v1/completions' reply for PROMPT, 16 greedy tokens, from a server on `model_dir`; asserts its tokens are
    `want`'s."""
    server = launch(model_dir, "native", **engine_options)
    try:
        body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
                "logprobs": 0}
        reply = httpx.post(server.base_url + "/completions", json=body, timeout=60).json()
    finally:
        server.stop()
    assert reply["choices"][0]["logprobs"]["tokens"] == [server.engine.tokenizer.token_text(t) for t in want], reply
    return reply


def test_quantization_fp8_serves_the_greedy_ids_of_the_e4m3_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    reference = tmp_path / "e4m3"
    shutil.copytree(tiny_model_dir, reference)
    weights = load_file(str(reference / "model.safetensors"))
    for name in [n for n in weights if PROJECTION.search(n)]:
        values, scale = to_e4m3(weights[name], per_channel=True)
        weights[name] = values.float() * scale
    save_file(weights, str(reference / "model.safetensors"))
    want = hf_greedy(load_hf(reference), PROMPT, 16)
    assert want != hf_greedy(load_hf(tiny_model_dir), PROMPT, 16)  # the E4M3 rounding shows in these ids
    reply = _served_greedy(tiny_model_dir, want, quantization="fp8")
    assert reply["usage"]["completion_tokens"] == 16


def test_an_awq_checkpoint_serves_the_greedy_ids_of_its_dequantized_weights(tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    """An AWQ (GEMM layout) INT4 checkpoint through the HTTP server: the ids of its dequantized float model."""
    quantized, plain = write_int4_checkpoint(tiny_model_dir, tmp_path, "awq")
    want = hf_greedy(load_hf(plain), PROMPT, 16)
    assert want != hf_greedy(load_hf(tiny_model_dir), PROMPT, 16)  # the INT4 rounding shows in these ids
    _served_greedy(quantized, want)


def test_an_fp8_checkpoints_kv_scales_serve_the_fp8_cache(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A ModelOpt FP8 checkpoint with k/v scales (keys and values past 448: tests/fp8_checkpoints.py's amplify_kv)
    and --kv-cache-dtype fp8: /v1/completions gives transformers' ids over a cache rounded through the same scaled
    E4M3, not scale 1's."""
    scales = kv_scales_for(2)
    quantized, plain = write_fp8_checkpoint(amplify_kv(tiny_model_dir, tmp_path), tmp_path, "modelopt",
                                            kv_scales=scales)
    hf = load_hf(plain)
    want = hf_greedy_fp8(hf, PROMPT, 16, scales)
    assert want != hf_greedy_fp8(hf, PROMPT, 16)  # scale 1 saturates these keys and values
    _served_greedy(quantized, want, kv_cache_dtype="fp8")
