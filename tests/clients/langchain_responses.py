"""LangChain's ChatOpenAI on the responses API, as its users run it through the
gateway:

- with a reasoning summary, two turns: the second replays the reasoning item as
  LangChain does against OpenAI (`{type: reasoning, id, summary}`, no encrypted
  content, since OpenAI keeps that server-side); the gateway stored the turn, so
  the rung must get the reasoning back whole (issue 28 point 3);
- with `use_previous_response_id=True`, a tool call, its answer and the user's
  next message: each turn sends only what is new, and the rung must get the whole
  conversation.

Each turn checks what reached the mock provider. Run by tests/clients.rs.
"""
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from common import (BASE, KEY, WEATHER, WEATHER_ARGS, case, expect, finish, input_items,
                    item_text, script, sent, tool_call)

ANSWER = "Hello from mock cg1."


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return WEATHER


def blocks(message, kind):
    return [b for b in message.content if isinstance(b, dict) and b.get("type") == kind] \
        if isinstance(message.content, list) else []


def reasoning_summary():
    llm = ChatOpenAI(model="cl-gpt", base_url=BASE + "/v1", api_key=KEY, max_retries=0,
                     use_responses_api=True,
                     reasoning={"effort": "low", "summary": "auto"})
    messages = [HumanMessage("Think about Paris.")]
    first = llm.invoke(messages)
    reasoning = blocks(first, "reasoning")
    expect(len(reasoning) == 1 and reasoning[0]["summary"][0]["text"].startswith("Thinking about"),
           "turn 1 gives the reasoning summary", first.content)
    expect(not reasoning[0].get("encrypted_content"),
           "the encrypted reasoning is not given to a client that did not ask for it", reasoning)
    rs_id = reasoning[0]["id"]

    # Turn 2, streamed: LangChain replays the reasoning item by id, without its
    # encrypted content.
    messages += [first, HumanMessage("And London?")]
    streamed = None
    for chunk in llm.stream(messages):
        streamed = chunk if streamed is None else streamed + chunk
    text = "".join(b.get("text", "") for b in blocks(streamed, "text"))
    expect(text == ANSWER, "the second answer", streamed.content)
    body = sent("cg1")[-1]
    items = input_items(body)
    replayed = [i for i in items if i.get("type") == "reasoning"]
    expect(len(replayed) == 1, "the rung got the reasoning item back", rs_id, items)
    # The mock's encrypted reasoning is `gAAAAB-mock-<its item id>`: the rung must
    # get back exactly what it gave for that item.
    expect(replayed[0].get("encrypted_content") == f"gAAAAB-mock-{replayed[0].get('id')}",
           "the gateway put the stored encrypted reasoning back in", rs_id, replayed[0])
    said = [item_text(i) for i in items if i.get("role") == "assistant"]
    expect(said == ["Hello from mock cg1."], "the first answer is in the history", items)
    expect([item_text(i) for i in items if i.get("role") == "user"]
           == ["Think about Paris.", "And London?"], "both user messages reached the rung", items)


def previous_response_id():
    llm = ChatOpenAI(model="cl-gpt", base_url=BASE + "/v1", api_key=KEY, max_retries=0,
                     use_responses_api=True, use_previous_response_id=True)
    llm = llm.bind_tools([get_weather])
    script("cg1", tool_call())
    messages = [HumanMessage("What is the weather in Paris?")]
    first = llm.invoke(messages)
    expect(first.tool_calls and first.tool_calls[0]["args"] == WEATHER_ARGS, "a tool call", first)
    call_id = first.tool_calls[0]["id"]
    messages += [first, ToolMessage(WEATHER, tool_call_id=call_id)]

    second = llm.invoke(messages)
    sent_by_client = second.response_metadata
    expect(second.text == ANSWER, "the answer after the tool", second.content)
    body = sent("cg1")[-1]
    expect("previous_response_id" not in body, "the rung is sent the history, not an id", body)
    items = input_items(body)
    kinds = [i.get("type", "message") for i in items]
    expect(kinds == ["message", "function_call", "function_call_output"],
           "turn 2 reached the rung as the whole conversation", items)
    expect(items[1]["call_id"] == call_id and items[2]["call_id"] == call_id
           and items[2]["output"] == WEATHER, "the call and its output, tied", items)

    messages += [second, HumanMessage("And tomorrow?")]
    streamed = None
    for chunk in llm.stream(messages):
        streamed = chunk if streamed is None else streamed + chunk
    expect(streamed.text == ANSWER, "the third answer", streamed.content)
    items = input_items(sent("cg1")[-1])
    kinds = [i.get("type", "message") for i in items]
    expect(kinds == ["message", "function_call", "function_call_output", "message", "message"],
           "turn 3 reached the rung as the whole conversation", items, sent_by_client)
    expect(item_text(items[3]) == ANSWER and item_text(items[4]) == "And tomorrow?",
           "the answer and the new message close the history", items)


case("responses: reasoning summary replayed on the second turn", reasoning_summary)
case("responses: use_previous_response_id over a tool call", previous_response_id)
finish()
