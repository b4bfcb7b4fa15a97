"""Grammar-constrained (guided) decoding with xgrammar.

- grammars.py: GuidedDecoding -> xgrammar Grammar (compact JSON; tool-call structural tags);
- schema_check.py: unsupported JSON-schema keywords -> InvalidRequestError naming them;
- compiler.py: GuidedCompiler, compiled grammars cached by constraint, per tokenizer;
- guide.py: GuideState, one sample's matcher (`fill_bitmask`, `accept_tokens`, `draft_positions`);
- bitmask.py: batched bitmask fill and apply, used by the sampler.
"""

from runtime.guided.bitmask import apply_bitmask, fill_bitmasks
from runtime.guided.compiler import GuidedCompiler
from runtime.guided.guide import DraftPosition, GuideState
from runtime.guided.schema_check import check_schema, unsupported_features

__all__ = ["DraftPosition", "GuideState", "GuidedCompiler", "apply_bitmask", "check_schema", "fill_bitmasks",
           "unsupported_features"]
