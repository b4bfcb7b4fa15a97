"""--speculative eagle on the CPU's fast decode steps: the C++ step (runtime/native/cpu/decode_step.cpp) and the
compiled step hand out the final hidden states an EAGLE head reads, equal to the op-by-op step's, so under EAGLE plain
and verification steps run through them (ModelRunner.eager_steps counts only the prompts' steps) and greedy ids stay
plain greedy's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from runtime.native.cpu.native_decode import NativeDecode
from runtime.native.cpu.paged_attention import build_kernel, use_cpu_kernels
from runtime.native.model_runner import ModelRunner
from runtime.native.models import load_model
from runtime.native.models.cpu_weights import prepare_cpu_weights
from runtime.native.sampler import Sampler
from runtime.native.speculative import guard
from runtime.native.step_inputs import StepInput, StepInputs
from tests.engine_harness import request, running_engine
from tests.tiny_models import build_tiny_model
from tests.unit.test_spec_eagle import write_eagle3, write_head
from tests.unit.test_spec_engine import prompts, run_all

BS = 4
# a verification-shaped step: 4 rows of one sequence (the token and 3 drafts) across a block boundary, beside one
# sequence's one row
PROMPTS = [StepInput([5, 9, 17, 3, 8, 11, 2], 0, [1, 2]), StepInput([7, 6, 4, 12, 30], 0, [3, 4])]
VERIFY = [StepInput([21, 22, 23, 24], 7, [1, 2, 5]), StepInput([13], 5, [3, 4])]
DECODE = [StepInput([21], 7, [1, 2]), StepInput([13], 5, [3, 4])]  # the same sequences' plain step
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 0.02, "atol": 0.04}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tiny Llama target (tests/tiny_models.py) and an untrained head shaped for it."""
    root = tmp_path_factory.mktemp("eagle-cpu-steps")
    (root / "head").mkdir()
    return build_tiny_model(root, "llama"), write_head(root / "head", 64, 4, 2, 16, 10000.0)


@pytest.fixture()
def kernels() -> None:
    assert build_kernel(), "the C++ kernels did not build"
    yield
    use_cpu_kernels(False)  # later tests in this process get the reference backend, as the suite configures


def hidden_of(runner: ModelRunner, step: list[StepInput], graphs: object = None) -> torch.Tensor:
    """The hidden states the runner keeps from `step`, run by `graphs` (None: op by op) after PROMPTS (op by op; a
    second time, they write the same keys and values again)."""
    runner.graphs = None
    runner.execute(StepInputs.of(PROMPTS))
    runner.graphs = graphs  # type: ignore[assignment]
    runner.execute(StepInputs.of(step))
    assert runner.hidden is not None
    values, first_rows = runner.hidden
    assert first_rows == StepInputs.of(step).first_rows()
    return values.clone()


def c_plus_plus_runner(target: Path, dtype: torch.dtype) -> tuple[ModelRunner, NativeDecode]:
    """A runner keeping hidden states over the int4 form of `target`, and its C++ step (not set yet)."""
    model = load_model(str(target), dtype, torch.device("cpu"))
    prepare_cpu_weights(model, "int4")
    use_cpu_kernels(True)  # the eager step's attention and products are the C++ step's kernels, as in serving
    runner = ModelRunner(model, BS, Sampler(0))
    runner.allocate_kv_cache(8)
    runner.keep_hidden = True
    return runner, NativeDecode(model, runner.kv_caches, BS, 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("step", [VERIFY, DECODE], ids=["verification", "decode"])
def test_the_c_plus_plus_step_hands_out_the_eager_steps_hidden_states(tiny, kernels, dtype: torch.dtype,
                                                                      step: list[StepInput]) -> None:
    """Bit for bit in bfloat16 decode steps; to rounding where the eager step sums in another order (float32, and the
    attention of a verification's rows, which the eager step runs as a prompt's)."""
    runner, native = c_plus_plus_runner(tiny[0], dtype)
    eager = hidden_of(runner, step)
    fast = hidden_of(runner, step, native)
    assert runner.eager_steps == 3  # the step ran in C++
    assert fast.dtype == dtype
    if dtype == torch.bfloat16 and step is DECODE:
        assert torch.equal(fast, eager)
    else:
        torch.testing.assert_close(fast, eager, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_c_plus_plus_steps_rows_do_not_depend_on_the_other_rows(tiny, kernels, dtype: torch.dtype) -> None:
    """What keeps EAGLE exact on it: a verification's first row is a plain step's row, bit for bit."""
    runner, native = c_plus_plus_runner(tiny[0], dtype)
    verification, decode = hidden_of(runner, VERIFY, native), hidden_of(runner, DECODE, native)
    assert torch.equal(verification[[0, 4]], decode)


def test_the_compiled_step_hands_out_the_eager_steps_hidden_states(tiny) -> None:
    model = load_model(str(tiny[0]), torch.float32, torch.device("cpu"))
    runner = ModelRunner(model, BS, Sampler(0))
    runner.allocate_kv_cache(8)
    runner.keep_hidden = True
    eager = hidden_of(runner, DECODE[:1])
    fast = hidden_of(runner, DECODE[:1], runner.compile_decode(8, scratch_block=7))
    assert runner.eager_steps == 3  # the step ran compiled
    # inductor fuses the norms and adds, so the sums run in another order: equal to float32 rounding
    torch.testing.assert_close(fast, eager, **TOLERANCE[torch.float32])


FAST = {"cpu_compile": True, "cpu_quantization": "int4"}  # the tiny Llama's steps in C++


async def _greedy(target: Path, reqs: list, **config: object) -> tuple[list[list[int]], int, int, int]:
    """Greedy ids of `reqs` served together on the C++ steps; the steps without a prompt that ran op by op; the steps
    after which the runner held no hidden states; the drafts proposed."""
    async with running_engine(target, **FAST, **config) as engine:
        runner, core = engine.runner, engine.core
        assert isinstance(runner.graphs, NativeDecode)
        counts = {"eager decode steps": 0, "without hidden states": 0}
        schedule, launch, batches = core.scheduler.schedule, runner.launch, []

        def scheduled():
            batches.append(schedule())
            return batches[-1]

        def launched(inputs, copies=()):
            before = runner.eager_steps
            pending = launch(inputs, copies)
            counts["eager decode steps"] += runner.eager_steps > before and not any(batches[-1].prefill)
            counts["without hidden states"] += runner.hidden is None
            return pending

        core.scheduler.schedule, runner.launch = scheduled, launched
        outs = await run_all(engine, reqs)
        stats = engine.stats()
    return ([o.tokens[0] for o in outs], counts["eager decode steps"], counts["without hidden states"],
            stats.spec_draft_tokens)


async def test_eagle_verifies_on_the_c_plus_plus_step_and_equals_plain_greedy(tiny) -> None:
    target, head = tiny
    ps = prompts(3, seed=41)
    want, _, _, _ = await _greedy(target, [request(f"p{i}", p, 20) for i, p in enumerate(ps)])
    got, eager, without, drafted = await _greedy(target, [request(f"e{i}", p, 20) for i, p in enumerate(ps)],
                                                 speculative="eagle", draft_model=head, num_draft_tokens=3)
    assert got == want
    assert drafted > 0 and eager == 0 and without == 0  # every decode step, verifications too: C++


async def test_plain_steps_the_guard_chooses_under_eagle_run_the_c_plus_plus_step(tiny, monkeypatch) -> None:
    """The guard measured plain steps faster: they run as without EAGLE (C++), and the head still gets their hidden
    states (a later speculating step drafts from them)."""
    target, head = tiny
    ps = prompts(2, seed=43)
    want, _, _, _ = await _greedy(target, [request(f"p{i}", p, 20) for i, p in enumerate(ps)])
    monkeypatch.setattr(guard._Rates, "choose", lambda self: False)
    got, eager, without, drafted = await _greedy(target, [request(f"g{i}", p, 20) for i, p in enumerate(ps)],
                                                 speculative="eagle", draft_model=head, num_draft_tokens=3,
                                                 speculative_guard=True)
    assert got == want
    assert drafted == 0 and eager == 0 and without == 0


async def test_an_eagle3_head_keeps_the_steps_op_by_op(tmp_path: Path) -> None:
    """An EAGLE-3 head reads the inputs of some of the target's layers (forward hooks), which the C++ step does not
    hand out: no C++ or compiled steps then, and its drafts come from the layers' real inputs."""
    target = build_tiny_model(tmp_path, "llama", num_hidden_layers=6)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    (tmp_path / "eagle3").mkdir()
    head = write_eagle3(tmp_path / "eagle3", 64, vocab, vocab // 2)
    async with running_engine(target, speculative="eagle", draft_model=head, **FAST) as engine:
        assert engine.runner.graphs is None
