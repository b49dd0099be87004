"""The official OpenAI Python SDK against pdrouter (PD mode, mock workers).

The mock's k-th generated token is the text " tok{k}"; it generates 8 tokens unless the request
caps it (finish "length") or a stop sequence ends it (finish "stop"); its natural end is "stop".
"""

import asyncio
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
from pydantic import BaseModel

from conftest import API_KEY, MODEL, mock_post, mock_stats

USER = [{"role": "user", "content": "Say something."}]


def toks(n):
    return "".join(f" tok{k}" for k in range(n))


@pytest.fixture()
def client(pd):
    return openai.OpenAI(base_url=pd.base_url, api_key=API_KEY, max_retries=0, timeout=30)


def test_chat_completion(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
    assert r.object == "chat.completion"
    assert r.model == MODEL
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == toks(3)
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 3
    assert r.usage.total_tokens == r.usage.prompt_tokens + 3


def test_finish_reason_stop_and_stop_sequences(client):
    r = client.chat.completions.create(model=MODEL, messages=USER)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (toks(8), "stop")
    r = client.chat.completions.create(model=MODEL, messages=USER, stop=["tok2", "never"])
    assert r.choices[0].message.content == " tok0 tok1 "
    assert r.choices[0].finish_reason == "stop"
    r = client.completions.create(model=MODEL, prompt="p", stop="tok1")
    assert (r.choices[0].text, r.choices[0].finish_reason) == (" tok0 ", "stop")


def test_completion_and_n(client):
    r = client.completions.create(model=MODEL, prompt="Once", max_tokens=2, n=2)
    assert r.object == "text_completion"
    assert [c.text for c in r.choices] == [toks(2), toks(2)]
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == 4


def test_chat_streaming_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == toks(4)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes.count("length") == 1 and finishes[-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4


def test_chat_stream_helper(client):
    # No token cap: the helper refuses to finish a "length" answer (LengthFinishReasonError).
    with client.chat.completions.stream(model=MODEL, messages=USER) as s:
        events = list(s)
        final = s.get_final_completion()
    deltas = [e.delta for e in events if e.type == "content.delta"]
    assert "".join(deltas) == toks(8)
    done = [e for e in events if e.type == "content.done"]
    assert len(done) == 1 and done[0].content == toks(8)
    assert final.choices[0].message.content == toks(8)
    assert final.choices[0].finish_reason == "stop"


def test_chat_stream_helper_reports_a_length_finish(client):
    with pytest.raises(openai.LengthFinishReasonError):
        with client.chat.completions.stream(model=MODEL, messages=USER, max_tokens=2) as s:
            s.get_final_completion()


class City(BaseModel):
    name: str
    population: int
    coastal: bool


def test_parse_with_a_json_schema(client):
    r = client.chat.completions.parse(model=MODEL, messages=USER, response_format=City)
    msg = r.choices[0].message
    assert msg.parsed == City(name="tok", population=0, coastal=False)
    assert r.choices[0].finish_reason == "stop"


def test_responses_create(client):
    r = client.responses.create(model=MODEL, input="Hello", max_output_tokens=3)
    assert r.object == "response"
    assert r.status == "completed"
    assert r.output_text == toks(3)
    assert r.usage.output_tokens == 3


def test_responses_stream_helper(client):
    with client.responses.stream(model=MODEL, input="Hello", max_output_tokens=2) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.output_text == toks(2)
    assert final.status == "completed"


def test_async_client(pd):
    async def main():
        async with openai.AsyncOpenAI(
            base_url=pd.base_url, api_key=API_KEY, max_retries=0, timeout=30
        ) as c:
            many = await asyncio.gather(
                *[
                    c.chat.completions.create(model=MODEL, messages=USER, max_tokens=k)
                    for k in range(1, 5)
                ]
            )
            stream = await c.completions.create(
                model=MODEL, prompt="x", max_tokens=3, stream=True
            )
            streamed = "".join([ch.choices[0].text async for ch in stream if ch.choices])
            return [m.choices[0].message.content for m in many], streamed

    contents, streamed = asyncio.run(main())
    assert contents == [toks(k) for k in range(1, 5)]
    assert streamed == toks(3)


def test_error_classes(pd):
    bad = openai.OpenAI(base_url=pd.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model=MODEL, messages=USER)
    assert e.value.status_code == 401

    c = openai.OpenAI(base_url=pd.base_url, api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="no-such-model", messages=USER)
    assert e.value.code == "model_not_found"
    assert "no-such-model" in e.value.message

    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=[])
    assert e.value.status_code == 400
    assert e.value.body["code"] == e.value.code


def test_models_list_is_open_and_sdk_shaped(pd):
    # /v1/models needs no key.
    c = openai.OpenAI(base_url=pd.base_url, api_key="anything", max_retries=0)
    models = c.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].object == "model" and isinstance(models[0].created, int)
    assert c.models.retrieve(MODEL) == models[0]
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("no-such-model")
    assert e.value.code == "model_not_found"


def hold_the_prefill_slot(limited):
    """Sends one request that the hung Prefill mock holds; returns its thread and result box."""
    mock_post(limited.prefill_url, "/mock/controls", {"hang": True})
    result = {}

    def run():
        c = openai.OpenAI(base_url=limited.base_url, api_key=API_KEY, max_retries=0, timeout=60)
        r = c.chat.completions.create(model=MODEL, messages=USER, max_tokens=1)
        result["content"] = r.choices[0].message.content

    t = threading.Thread(target=run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while mock_stats(limited.prefill_url)["inflight"] < 1:
        assert time.monotonic() < deadline, "the held request never reached the Prefill mock"
        time.sleep(0.02)
    return t, result


def test_rate_limit_error_and_retries_honouring_retry_after(limited):
    t, held = hold_the_prefill_slot(limited)
    try:
        rejections = "smg_pd_prefill_admission_rejections_total"
        before = limited.metric(rejections)

        no_retry = openai.OpenAI(base_url=limited.base_url, api_key=API_KEY, max_retries=0)
        with pytest.raises(openai.RateLimitError) as e:
            no_retry.chat.completions.create(model=MODEL, messages=USER)
        assert e.value.status_code == 429
        assert e.value.code == "pd_prefill_queue_full"
        # The router's estimate of the wait, whole seconds in 1-10
        # (docs/admission.md: Retry-After).
        assert 1 <= int(e.value.response.headers["retry-after"]) <= 10
        assert limited.metric(rejections) == before + 1

        retrying = openai.OpenAI(base_url=limited.base_url, api_key=API_KEY, max_retries=1)
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError):
            retrying.chat.completions.create(model=MODEL, messages=USER)
        # Two attempts, the retry after the router's Retry-After (at least 1 s).
        assert limited.metric(rejections) == before + 3
        assert time.monotonic() - started >= 1.0
    finally:
        mock_post(limited.prefill_url, "/mock/controls", {"hang": False, "release_hung": 16})
        t.join(timeout=30)
    assert held.get("content") == toks(1)


def test_sdk_helpers_against_the_demo(demo):
    c = openai.OpenAI(base_url=demo + "/v1", api_key="unused", max_retries=0, timeout=60)
    with c.chat.completions.stream(model=MODEL, messages=USER) as s:
        final = s.get_final_completion()
    assert final.choices[0].message.content == toks(8)
    with c.responses.stream(model=MODEL, input="Hello") as s:
        final = s.get_final_response()
    assert final.output_text == toks(8)
