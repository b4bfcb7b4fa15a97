"""runtime/native/guided/compiler.py and cache.py: compiled grammars cached within a byte budget, compiles in the
compiler's own threads (a slow one holds up nothing else), too slow constraints refused and remembered."""

from __future__ import annotations

import asyncio
import threading

import pytest
from transformers import AutoTokenizer

import runtime.native.guided.compiler as compiler_module
from runtime.errors import InvalidRequestError, QueueFullError
from runtime.native.guided import GuidedCompiler
from runtime.native.guided.compiler import constraint_key
from runtime.request import GuidedDecoding
from tests.tiny_models import build_tiny_model

VOCAB = 300
EOS = 0


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("compiler"), "llama"))


def schema(i: int) -> GuidedDecoding:
    return GuidedDecoding(json_schema={"type": "object", "properties": {f"k{i}": {"type": "integer"}},
                                       "required": [f"k{i}"]})


def test_the_cache_is_bounded_by_bytes(tok) -> None:
    # It was bounded by count: 256 grammars of any size (a 100k-value enum alone kept 252 MB).
    size = GuidedCompiler(tok, VOCAB, [EOS]).compile(schema(0)).memory_size_bytes + len(constraint_key(schema(0)))
    compiler = GuidedCompiler(tok, VOCAB, [EOS], cache_bytes=int(3.5 * size))
    for i in range(6):
        compiler.compile(schema(i))
    assert len(compiler.cache) == 3 and compiler.cache.nbytes <= compiler.cache.max_bytes
    compiler.compile(schema(5))
    compiler.compile(schema(0))  # evicted: compiled again
    assert (compiler.misses, compiler.hits) == (7, 1)

    small = GuidedCompiler(tok, VOCAB, [EOS], cache_bytes=size // 2)  # a grammar larger than the budget: not kept
    small.compile(schema(0))
    small.compile(schema(0))
    assert (small.misses, small.hits, len(small.cache)) == (2, 0, 0)


def test_a_compile_past_the_time_limit_is_refused_and_remembered(tok, monkeypatch: pytest.MonkeyPatch) -> None:
    compiler = GuidedCompiler(tok, VOCAB, [EOS])
    monkeypatch.setattr(compiler_module, "MAX_COMPILE_SECONDS", 0.0)  # every compile is too slow
    with pytest.raises(InvalidRequestError, match=r"took \d+\.\d s of CPU to compile, more than the 0 s allowed; "
                                                  r"simplify it\.") as refused:
        compiler.compile(GuidedDecoding(regex="[0-9]+", param="guided_decoding"))
    assert refused.value.param == "guided_decoding"
    monkeypatch.setattr(compiler_module, "MAX_COMPILE_SECONDS", 5.0)
    with pytest.raises(InvalidRequestError, match="took") as again:  # refused without compiling again
        compiler.compile(GuidedDecoding(regex="[0-9]+", param="response_format"))
    assert again.value.param == "response_format" and compiler.misses == 0


async def test_slow_compiles_hold_up_only_new_constraints(tok, monkeypatch: pytest.MonkeyPatch) -> None:
    # Compiles ran in the event loop's default executor, shared with everything else, without bound.
    release = threading.Event()
    threads: list[str] = []
    build = compiler_module.build_grammar

    def slow_build(guided: GuidedDecoding):
        threads.append(threading.current_thread().name)
        if guided.regex is not None and guided.regex.startswith("slow"):
            release.wait(30)
        return build(guided)

    monkeypatch.setattr(compiler_module, "build_grammar", slow_build)
    compiler = GuidedCompiler(tok, VOCAB, [EOS], threads=2, max_queued=3)
    compiler.compile(GuidedDecoding(regex="[0-9]+"))
    slow = [asyncio.create_task(compiler.guide_factory_async(GuidedDecoding(regex=r))) for r in ("slow1", "slow1",
                                                                                                  "slow2")]
    await asyncio.sleep(0.2)  # both compile threads are held now
    make = await asyncio.wait_for(compiler.guide_factory_async(GuidedDecoding(regex="[0-9]+")), 2)  # cached: at once
    assert make().active
    queued = asyncio.create_task(compiler.guide_factory_async(GuidedDecoding(regex="x")))
    await asyncio.sleep(0.2)
    assert not queued.done()  # waits for a compile thread
    with pytest.raises(QueueFullError):  # slow1, slow2 and x are compiling or waiting: max_queued
        await compiler.guide_factory_async(GuidedDecoding(regex="y"))
    slow[0].cancel()  # one waiter leaving does not cancel the compile the second one shares
    release.set()
    for task in [*slow[1:], queued]:
        assert (await asyncio.wait_for(task, 10))().active
    assert compiler.misses == 4 and set(threads) <= {"guided-compile_0", "guided-compile_1"}
