"""OpenAI request -> runtime GenerationRequest(s)."""

from __future__ import annotations

from dataclasses import replace

from adapters.openai.requests import ChatCompletionRequest, CompletionRequest, SamplingFields
from adapters.openai.tool_prompt import prompt_conversation, tool_format
from adapters.openai.tools import chat_guided, template_tools
from runtime.request import GenerationRequest, SamplingOptions
from runtime.tokenizer import Tokenizer


def sampling_options(req: SamplingFields, *, max_tokens: int | None, logprobs: int | None,
                     prompt_logprobs: int | None = None) -> SamplingOptions:
    """The runtime's sampling options for the fields both endpoints share."""
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_k=max(req.top_k or 0, 0),  # vLLM's -1 and our 0 both mean "all tokens"
        top_p=1.0 if req.top_p is None else req.top_p,
        min_p=req.min_p or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        min_tokens=req.min_tokens,
        logit_bias={int(k): v for k, v in (req.logit_bias or {}).items()},
        seed=req.seed,
        stop=req.stop_list(),
        stop_token_ids=list(req.stop_token_ids or []),
        include_stop_str_in_output=req.include_stop_str_in_output,
        ignore_eos=req.ignore_eos,
        n=req.n,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        skip_special_tokens=req.skip_special_tokens,
    )


def engine_request_ids(response_id: str, count: int) -> list[str]:
    """One engine request id per prompt: the response id itself when there is a single prompt."""
    return [response_id] if count == 1 else [f"{response_id}-{i}" for i in range(count)]


def completion_requests(req: CompletionRequest, response_id: str,
                        adapter: str | None = None) -> list[GenerationRequest]:
    """One GenerationRequest per prompt (choices are later indexed prompt_index * n + sample)."""
    prompts = req.prompts()
    # Scoring a prompt runs one step (the engine always generates); the output drops that token.
    # best_of > n ranks samples by their tokens' logprobs: asked for (0: the sampled token's) even when not shown
    logprobs = 0 if req.logprobs is None and req.ranks_samples else req.logprobs
    sampling = sampling_options(req, max_tokens=1 if req.scores_prompt else req.max_tokens, logprobs=logprobs,
                                prompt_logprobs=req.logprobs if req.echo else None)
    sampling.n = req.samples
    out = []
    for rid, prompt in zip(engine_request_ids(response_id, len(prompts)), prompts, strict=True):
        text, ids = (prompt, None) if isinstance(prompt, str) else (None, list(prompt))
        out.append(GenerationRequest(request_id=rid, prompt=text, prompt_token_ids=ids,
                                     sampling=_copy(sampling), adapter=adapter,
                                     num_draft_tokens=req.num_draft_tokens, stream=bool(req.stream)))
    return out


def chat_messages(req: ChatCompletionRequest) -> list[dict]:
    """Messages as the chat template expects them: plain dicts, content as one string ("" for an assistant turn
    that only calls tools: templates concatenate it, as vLLM passes it).

    OpenAI's newer "developer" role is the system role under another name; templates know "system".
    """
    out = []
    for m in req.messages:
        d = m.model_dump(exclude_none=True, exclude={"content", "role"})
        d["role"] = "system" if m.role == "developer" else m.role
        d["content"] = m.text() or ""
        out.append(d)
    return out


def chat_request(req: ChatCompletionRequest, response_id: str, tokenizer: Tokenizer,
                 adapter: str | None = None) -> GenerationRequest:
    """The chat prompt (template applied; tools by it or by us, adapters/openai/tool_prompt.py) as one
    GenerationRequest."""
    messages, tools = prompt_conversation(chat_messages(req), template_tools(req.tools, req.tool_choice), tokenizer)
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                           **(req.chat_template_kwargs or {}))
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    return GenerationRequest(
        request_id=response_id,
        prompt=prompt,
        sampling=sampling_options(req, max_tokens=req.output_limit, logprobs=logprobs),
        adapter=adapter,
        num_draft_tokens=req.num_draft_tokens,
        add_special_tokens=False,  # the template already wrote BOS and friends
        stream=bool(req.stream),
        guided=chat_guided(req.tools, req.tool_choice, req.response_format, tool_format(tokenizer)),
    )


def _copy(options: SamplingOptions) -> SamplingOptions:
    """Each engine request owns its options (the engine may normalise them in place)."""
    return replace(options, logit_bias=dict(options.logit_bias), stop=list(options.stop),
                   stop_token_ids=list(options.stop_token_ids), bad_words=list(options.bad_words))
