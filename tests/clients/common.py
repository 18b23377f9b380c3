"""What every client-library script shares: where the gateway and the mock provider
are (SLUICE_BASE_URL, SLUICE_KEY, SLUICE_MOCK_URL, set by tests/clients.rs), the
mock's control API (script a model's next answers, read what reached it), and
checks that say what was expected and what came.

The libraries themselves are pointed at the gateway by base URL and key only.
"""
import json
import os
import sys
import traceback
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.environ["SLUICE_BASE_URL"]
KEY = os.environ["SLUICE_KEY"]
MOCK = os.environ["SLUICE_MOCK_URL"]

# The tool every case offers, and what it answers.
WEATHER_ARGS = {"city": "Paris"}
WEATHER = "Sunny, 21 C in Paris"


def _mock(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(MOCK + path, data=data, method=method,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def script(model, *steps):
    """Queues the next answers of upstream model `model` (the mock's Step JSON)."""
    _mock("POST", "/_mock/script", {"model": model, "steps": list(steps)})


def tool_call(name="get_weather", arguments=None):
    return {"kind": "tool_call", "name": name, "arguments": arguments or WEATHER_ARGS}


def sent(model):
    """The JSON bodies that reached upstream model `model`, oldest first."""
    out = []
    for r in _mock("GET", "/_mock/requests"):
        if r["model"] == model and r["body"]:
            out.append(json.loads(r["body"]))
    return out


def clear():
    _mock("POST", "/_mock/clear")


def show(value):
    try:
        return json.dumps(value, indent=1, default=str)[:4000]
    except TypeError:
        return repr(value)[:4000]


def expect(cond, what, *context):
    """Fails the script with what was expected and the values that show why."""
    if not cond:
        lines = [f"FAILED: {what}"] + [show(c) for c in context]
        raise AssertionError("\n".join(lines))


def step(name):
    print(f"-- {name}", file=sys.stderr, flush=True)


def input_items(body):
    """A responses request's input as a list of items (a string is one user message)."""
    items = body.get("input")
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    return items or []


def item_text(item):
    """The text of a message item (string content or its text parts)."""
    c = item.get("content")
    if isinstance(c, str):
        return c
    return "".join(p.get("text", "") for p in c or [] if isinstance(p, dict))


def anthropic_blocks(message):
    c = message.get("content")
    if isinstance(c, str):
        return [{"type": "text", "text": c}]
    return c or []


_failed = []


def case(name, fn, *args):
    """Runs one case on a mock that has forgotten earlier requests; a failure is
    reported and the script goes on to the next."""
    step(name)
    try:
        clear()
        fn(*args)
        print(f"PASS {name}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported the same way
        _failed.append(name)
        detail = "".join(traceback.format_exception_only(type(e), e)).strip().split("\n")
        # The first line is what tests/clients.rs matches known failures against.
        print(f"FAIL {name}: {detail[0]}", flush=True)
        for line in detail[1:]:
            print(f"    {line}", flush=True)
        ours = [f for f in traceback.extract_tb(e.__traceback__)
                if os.path.dirname(os.path.abspath(f.filename)) == HERE]
        if ours:
            print(f"    (at {os.path.basename(ours[-1].filename)}:{ours[-1].lineno})", flush=True)


def finish():
    """Exits non-zero when a case failed."""
    if _failed:
        print(f"{len(_failed)} case(s) failed: {', '.join(_failed)}", flush=True)
        sys.exit(1)
