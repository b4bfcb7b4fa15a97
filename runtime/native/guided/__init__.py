"""Grammar-constrained (guided) decoding with xgrammar.

- grammars.py: GuidedDecoding -> xgrammar Grammar (compact JSON; tool-call structural tags);
- runtime/schema_check.py (outside this package, so that the adapters use it without torch or xgrammar):
  unsupported JSON-schema keywords -> InvalidRequestError naming them;
- limits.py: how large and intricate a constraint may be (compile time and memory), checked first;
- cache.py: GrammarCache, compiled grammars by constraint within a byte budget;
- compiler.py: GuidedCompiler, compiles in its own threads, cached by constraint, per tokenizer;
- guide.py: GuideState, one sample's matcher (`active`, `accept_tokens`);
- bitmask.py: batched bitmask fill and apply, used by the sampler.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.native.guided.bitmask import apply_bitmask, fill_bitmasks
    from runtime.native.guided.compiler import GuidedCompiler
    from runtime.native.guided.guide import GuideState
    from runtime.schema_check import check_schema, unsupported_features

# Imported when first named: xgrammar (and the transformers it imports, 0.9 s) loads with the compiler, a guide or
# a constrained step, not in every process that holds a sampler (tensor-parallel workers never mask).
_HOMES = {"GuideState": "runtime.native.guided.guide", "GuidedCompiler": "runtime.native.guided.compiler",
          "apply_bitmask": "runtime.native.guided.bitmask", "fill_bitmasks": "runtime.native.guided.bitmask",
          "check_schema": "runtime.schema_check", "unsupported_features": "runtime.schema_check"}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
