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

from runtime.native.guided.bitmask import apply_bitmask, fill_bitmasks
from runtime.native.guided.compiler import GuidedCompiler
from runtime.native.guided.guide import GuideState
from runtime.schema_check import check_schema, unsupported_features

__all__ = ["GuideState", "GuidedCompiler", "apply_bitmask", "check_schema", "fill_bitmasks",
           "unsupported_features"]
