"""The CPU's faster code, built in a background thread while eager steps already serve.

First the paged decode-attention kernel (runtime/native/cpu/paged_attention.py: about 14 s with a C++ compiler the first
time, then loaded from torch's extension cache), then, where it pays, compiled one-stream decode steps
(runtime/native/cpu/compiled_decode.py: 60-70 s on the 2-core box, cached or not). Each switches in when it is ready:
the attention backend is looked up per call, the runner's graphs once per step, so a step runs either one whole.
Both give the tokens the eager steps give (tests/unit/test_compiled_decode.py, test_cpu_paged_attention.py).
Before, the engine served only once both were built: 75 s for a warm restart of the default model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from runtime.native.cpu.paged_attention import use_cpu_kernels
from runtime.native.model_runner import ModelRunner
from runtime.startup import StartupPhases

logger = logging.getLogger(__name__)


class CpuWarmUp:
    """Builds the kernel, then (with `compile_steps`) the compiled steps of `runner`, warming them up in the KV
    cache's block `scratch_block`, which no sequence uses; `done` is set when it has finished or given up."""

    def __init__(self, runner: ModelRunner, phases: StartupPhases, compile_steps: bool, max_blocks: int,
                 scratch_block: int, stopping: Callable[[], bool]) -> None:
        self.runner, self.phases, self.compile_steps = runner, phases, compile_steps
        self.max_blocks, self.scratch_block, self.stopping = max_blocks, scratch_block, stopping
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-warm-up", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            # one phase around both: the engine's phase stays set until everything is built
            with self.phases.phase("building faster CPU decode steps (eager steps serve meanwhile)"):
                with self.phases.phase("building the CPU decode-attention kernel"):
                    if self.stopping():
                        return
                    use_cpu_kernels(True)
                if self.compile_steps and not self.stopping():
                    with self.phases.phase("compiling one-stream decode steps"):
                        graphs = self.runner.compile_decode(self.max_blocks, self.scratch_block)
                    if not self.stopping():
                        self.runner.graphs = graphs
        except Exception:
            logger.exception("CPU: building the faster decode steps failed; eager steps serve")
        finally:
            self.done.set()
