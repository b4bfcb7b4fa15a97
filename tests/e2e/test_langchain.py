"""langchain-openai's ChatOpenAI against the real server (invoke and stream)."""

from __future__ import annotations

from langchain_openai import ChatOpenAI

from tests.e2e.conftest import MODEL_NAME, RunningServer


def test_invoke_and_stream_agree(server: RunningServer) -> None:
    llm = ChatOpenAI(base_url=server.base_url, api_key="unused", model=MODEL_NAME, temperature=0, max_tokens=5,
                     max_retries=0, extra_body={"ignore_eos": True})
    reply = llm.invoke("Say hello")
    assert isinstance(reply.content, str) and reply.content
    assert reply.usage_metadata["output_tokens"] == 5
    assert reply.response_metadata["finish_reason"] == "length"
    streamed = "".join(chunk.content for chunk in llm.stream("Say hello"))
    assert streamed == reply.content


async def test_ainvoke_and_astream_agree(server: RunningServer) -> None:
    llm = ChatOpenAI(base_url=server.base_url, api_key="unused", model=MODEL_NAME, temperature=0, max_tokens=4,
                     max_retries=0, extra_body={"ignore_eos": True})
    reply = await llm.ainvoke([("system", "You are terse."), ("user", "Name a colour")])
    assert reply.usage_metadata["output_tokens"] == 4
    streamed = "".join([chunk.content async for chunk in llm.astream([("system", "You are terse."),
                                                                      ("user", "Name a colour")])])
    assert streamed == reply.content
