"""The native PyTorch engine: everything here may import torch; nothing outside the engine core's process
imports it (the front end and the TensorRT-LLM backend never do).

    engine_core.py     EngineCore: add_request / abort / step() -> StepOutput (no asyncio, no threads)
    scheduler.py       the only code that changes sequences and KV blocks (schedule, update_from_output)
    block_manager.py   paged KV blocks, prefix reuse; sequence.py one request's tokens and blocks
    model_runner.py    a scheduled batch -> tensors -> one forward -> sampled ids (sampler.py)
    llm_engine.py      NativeEngine: the in-process driver (a thread calling step()); core_process.py the
                       engine core's own process (its driver); core_loader.py builds either's core
    models/ cpu/ cuda/ lora/ speculative/ guided/   model code, kernels, LoRA, speculation, grammars
"""
