"""The official OpenAI Python SDK against pdrouter in front of gRPC workers, where the router
itself turns the model's text into tool calls, reasoning and structured output.

The mocks write given model text (`--output-text`): Qwen-style reasoning and a `<tool_call>`,
or a JSON object. The router runs with `--tool-call-parser qwen --reasoning-parser qwen3`.
"""

import json

import openai
import pytest
from pydantic import BaseModel

from conftest import API_KEY, MODEL, ROUTER_BIN, Proc, start_mock

CALL = (
    "<think>The user wants the weather.</think>Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
CITY = '{"name": "Paris", "population": 2100000, "coastal": false}'

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def grpc_router(text):
    """A gRPC PD router over a Prefill mock and a Decode mock writing `text` then EOS."""
    procs = []
    try:
        prefill, prefill_url = start_mock("prefill", "--grpc")
        procs.append(prefill)
        decode, decode_url = start_mock(
            "decode", "--grpc", "--output-text", text, "--output-tokens", str(len(text.encode()) + 1)
        )
        procs.append(decode)
        port = prefill_url.rsplit(":", 1)[1]
        router = Proc(
            [
                ROUTER_BIN,
                "launch",
                "--pd-disaggregation",
                "--prefill", prefill_url, port,
                "--decode", decode_url,
                "--host", "127.0.0.1",
                "--port", "0",
                "--prometheus-host", "127.0.0.1",
                "--prometheus-port", "0",
                "--api-key", API_KEY,
                "--log-level", "warn",
                "--tool-call-parser", "qwen",
                "--reasoning-parser", "qwen3",
            ]
        )
        procs.append(router)
        url = router.wait_for("pdrouter listening on ")
        return url, procs
    except BaseException:
        for p in reversed(procs):
            p.stop()
        raise


def sdk_over(text):
    url, procs = grpc_router(text)
    try:
        yield openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)
    finally:
        for p in reversed(procs):
            p.stop()


@pytest.fixture(scope="module")
def calling():
    """The SDK over gRPC mocks whose Decode writes reasoning and a tool call."""
    yield from sdk_over(CALL)


@pytest.fixture(scope="module")
def structured():
    """The SDK over gRPC mocks whose Decode writes a JSON object."""
    yield from sdk_over(CITY)


def test_tool_calls_with_create(calling):
    r = calling.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # Reasoning is an extra field of the message, as vLLM's and SGLang's servers send it.
    assert choice.message.model_extra["reasoning_content"] == "The user wants the weather."
    assert r.usage.completion_tokens_details.reasoning_tokens > 0


def test_tool_calls_with_the_stream_helper(calling):
    with calling.chat.completions.stream(model=MODEL, messages=USER, tools=TOOLS) as s:
        events = list(s)
        final = s.get_final_completion()
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert len(done) == 1 and done[0].name == "get_weather"
    assert json.loads(done[0].arguments) == {"city": "Paris"}
    msg = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls[0].function.name == "get_weather"
    content = "".join(e.delta for e in events if e.type == "content.delta")
    assert content == "Let me check."


def test_a_two_turn_tool_conversation(calling):
    first = calling.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS)
    msg = first.choices[0].message
    call = msg.tool_calls[0]
    # What the SDK sends back: the assistant message as returned (content kept, tool_calls with
    # arguments as JSON text), then the tool's answer.
    messages = USER + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    second = calling.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    assert second.choices[0].message.tool_calls


class City(BaseModel):
    name: str
    population: int
    coastal: bool


def test_parse_with_a_pydantic_response_format(structured):
    r = structured.chat.completions.parse(model=MODEL, messages=USER, response_format=City)
    assert r.choices[0].message.parsed == City(name="Paris", population=2100000, coastal=False)
    assert r.choices[0].finish_reason == "stop"


def test_a_forced_call_of_a_function_not_offered_is_a_400(calling):
    with pytest.raises(openai.BadRequestError) as e:
        calling.chat.completions.create(
            model=MODEL,
            messages=USER,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert "tool_choice" in str(e.value)


RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": TOOLS[0]["function"]["parameters"],
    }
]


def test_responses_with_a_function_tool(calling):
    """The Responses API: the SDK's typed items, whole and streamed, and a second turn."""
    r = calling.responses.create(model=MODEL, input="Weather in Paris?", tools=RESPONSES_TOOLS)
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message", "function_call"], r.output
    call = r.output[2]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert r.output_text == "Let me check."
    assert r.usage.output_tokens_details.reasoning_tokens > 0

    with calling.responses.stream(
        model=MODEL, input="Weather in Paris?", tools=RESPONSES_TOOLS
    ) as stream:
        args = "".join(
            e.delta for e in stream if e.type == "response.function_call_arguments.delta"
        )
        final = stream.get_final_response()
    assert json.loads(args) == {"city": "Paris"}
    assert [item.type for item in final.output] == kinds

    second = calling.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"},
        ],
        tools=RESPONSES_TOOLS,
    )
    assert second.status == "completed"
