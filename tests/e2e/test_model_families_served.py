"""The families of issue 43 through the HTTP server: a tiny gpt-oss (MoE, attention sinks, sliding windows, YaRN)
served by the real gateway gives transformers' greedy ids on /v1/completions and renders its chat template on
/v1/chat/completions; a checkpoint of an architecture we do not serve is refused at start-up in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime.architectures import SUPPORTED_ARCHITECTURES
from tests.e2e.conftest import MODEL_NAME, RunningServer, launch
from tests.engine_harness import hf_greedy, load_hf
from tests.tiny_models import CHATML_TEMPLATE, SLIDING_WINDOW, build_tiny_model

ROOT = Path(__file__).resolve().parents[2]


# ChatML with a switch for thinking, in the manner of Qwen3's template (an empty think block when it is off)
THINKING_TEMPLATE = CHATML_TEMPLATE.replace(
    "{{ '<|im_start|>assistant\n' }}",
    "{{ '<|im_start|>assistant\n' }}{% if enable_thinking is defined and not enable_thinking %}"
    "{{ '<think>\n\n</think>\n\n' }}{% endif %}")


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer

    folder = build_tiny_model(tmp_path_factory.mktemp("families-e2e"), "gpt_oss")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = THINKING_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def server(gpt_oss: Path) -> Iterator[RunningServer]:
    srv = launch(gpt_oss, "native", max_num_tokens=8, engine_process=True)  # as `serve` runs; prompts in chunks
    yield srv
    srv.stop()


def test_completions_return_transformers_greedy_ids(server: RunningServer, gpt_oss: Path) -> None:
    hf = load_hf(gpt_oss)
    prompts = [[7, 99, 31, 250, 4], list(range(40, 40 + 2 * SLIDING_WINDOW + 5))]
    for prompt in prompts:
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 18, "temperature": 0, "ignore_eos": True,
                "logprobs": 0}
        reply = httpx.post(server.base_url + "/completions", json=body, timeout=60).json()
        tokens = reply["choices"][0]["logprobs"]["tokens"]  # the text of each generated id
        assert tokens == [server.engine.tokenizer.token_text(t) for t in hf_greedy(hf, prompt, 18)], reply
        usage = reply["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(prompt), 18)


@pytest.mark.parametrize("template_kwargs", [None, {"enable_thinking": False}])
def test_chat_renders_the_checkpoint_template(server: RunningServer, gpt_oss: Path, template_kwargs) -> None:
    """The checkpoint's own template, with vLLM's chat_template_kwargs (Qwen3's thinking switch) passed to it."""
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "hello there"}]
    expected = AutoTokenizer.from_pretrained(gpt_oss).apply_chat_template(messages, add_generation_prompt=True,
                                                                           **(template_kwargs or {}))
    expected = expected["input_ids"] if "input_ids" in expected else expected
    body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 3, "temperature": 0,
            "chat_template_kwargs": template_kwargs}
    reply = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60).json()
    assert reply["usage"]["prompt_tokens"] == len(expected), reply
    body["chat_template_kwargs"] = {"tools": []}
    reply = httpx.post(server.base_url + "/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "chat_template_kwargs", reply.text


def test_unsupported_architecture_is_refused_at_start_up_in_one_line(gpt_oss: Path, tmp_path: Path) -> None:
    folder = tmp_path / "falcon"
    shutil.copytree(gpt_oss, folder)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["FalconForCausalLM"]
    (folder / "config.json").write_text(json.dumps(config))
    out = subprocess.run([sys.executable, "-m", "gateway", "serve", "--model", str(folder), "--device", "cpu"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        "trtllm-gateway: error: Unsupported model architecture 'FalconForCausalLM'. Supported architectures: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)}.")
