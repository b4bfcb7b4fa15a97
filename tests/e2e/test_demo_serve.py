"""The README's serve path: the installed console script `trtllm-gateway serve` with no --model serves the
embedded demo model, and the official openai SDK gets a chat answer from it."""

from __future__ import annotations

import shutil
import subprocess
from importlib.metadata import entry_points
from pathlib import Path

import httpx
import openai

from runtime.demo import demo_model_path
from runtime.tokenizer import Tokenizer
from tests.e2e.conftest import free_port
from tests.e2e.test_shutdown import ROOT, wait_ready

MESSAGES = [{"role": "user", "content": "def add(a, b):"}]


def test_console_script_serves_the_demo_model_without_model_flag(tmp_path: Path) -> None:
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "trtllm-gateway"]
    assert script.value == "gateway.cli:main"
    exe = shutil.which("trtllm-gateway")
    assert exe, "the trtllm-gateway console script is not on PATH: install the package (make install)"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "server.log").open("w") as log:
        proc = subprocess.Popen([exe, "serve", "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=log)
    try:
        wait_ready(url, proc)
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["demo"]
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        out = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=8, temperature=0)
        again = client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=8, temperature=0)
    finally:
        proc.terminate()
        proc.wait(30)
    tok = Tokenizer.from_pretrained(demo_model_path())
    prompt = tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)
    choice = out.choices[0]
    assert out.model == "demo" and choice.message.role == "assistant" and choice.message.content
    assert out.usage.prompt_tokens == len(prompt)
    assert choice.finish_reason == "length" and out.usage.completion_tokens == 8
    assert again.choices[0].message.content == choice.message.content  # greedy: the same answer
