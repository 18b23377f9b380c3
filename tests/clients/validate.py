"""Checks every OpenAI-format body and stream event the gateway gave the client
libraries (recorded by the tap in tests/clients/tap.rs) against OpenAI's published
OpenAPI document (openapi/openapi.yaml, see openapi/README.md), so that a shape
that drifts fails CI; and the stream rules a schema cannot say (issue 28 points 6
and 8, and 9 on the messages route).

    python validate.py CAPTURE.json

CAPTURE.json: `[{method, path, request, status, content_type, body}, ...]`.
Prints one line per violation and exits 1 when there is any.

What is checked, by route (OpenAI routes only; the messages route is Anthropic's
format, checked for the stream rules alone):
- POST /v1/chat/completions: a whole answer against CreateChatCompletionResponse,
  each stream chunk against CreateChatCompletionStreamResponse, `[DONE]` last.
- POST /v1/responses: a whole answer against Response, each stream event against
  the ResponseStreamEvent variant its `type` names (an unknown type fails).
- POST /v1/embeddings: CreateEmbeddingResponse. GET /v1/models: ListModelsResponse.
- Every 4xx/5xx answer on those routes, and an `error` chunk in a chat stream:
  ErrorResponse.

How the document is read:
- OpenAPI 3.1 is JSON Schema 2020-12, so the component schemas are used as they
  are, with one exception: a few schemas still carry OpenAPI 3.0's
  `nullable: true` (e.g. the chat stream chunk's `usage`), which 2020-12 ignores;
  such a schema is read as "this, or null", as OpenAI's own SDK generator reads
  it. Two members the document's own examples show as null where its schema
  gives only a type (Response's `usage` and `user`, see NULL_AS_IN_EXAMPLES) are
  read the same way; and base64 embeddings, which the document's request
  documents but its answer schema does not, are validated decoded.
- The gateway adds members of its own (`provider`, `usage.cost`, the receipt
  `x_gateway`, `x-service-ignored-parameters`, model entries' `pricing`). Where a
  schema closes the object they sit in (`additionalProperties: false` on the
  answer, its `usage` or a model entry) a copy without them is validated; in
  2.3.0 none does (checked at load, and printed), so the answers are validated as
  they are.
"""
import base64
import copy
import json
import os
import struct
import sys

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = os.path.join(HERE, "openapi", "openapi.yaml")
ROOTS = {
    "chat": "CreateChatCompletionResponse",
    "chat_chunk": "CreateChatCompletionStreamResponse",
    "response": "Response",
    "embeddings": "CreateEmbeddingResponse",
    "models": "ListModelsResponse",
    "error": "ErrorResponse",
}
# The gateway's documented extension members, by where they sit.
TOP_EXTENSIONS = ("provider", "x_gateway", "x-service-ignored-parameters")


def _nullable(node):
    """OpenAPI 3.0's `nullable: true` as 2020-12 says it."""
    if isinstance(node, list):
        return [_nullable(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: _nullable(v) for k, v in node.items()}
    if node.pop("nullable", False) is True:
        return {"anyOf": [node, {"type": "null"}]}
    return node


# Members the document's own examples show as null (ResponseCreatedEvent's and
# ResponseInProgressEvent's examples: `"usage": null`, `"user": null`, as OpenAI's
# API sends them) where its schema gives only a type: read as "this, or null".
NULL_AS_IN_EXAMPLES = [("Response", "usage"), ("ModelResponseProperties", "user")]


def _allow_null(schemas, name, member):
    """Makes `member` of schema `name` (its own properties or its allOf parts')
    nullable."""
    parts = [schemas[name]] + list(schemas[name].get("allOf", []))
    for part in parts:
        props = part.get("properties", {}) if isinstance(part, dict) else {}
        if member in props:
            props[member] = {"anyOf": [props[member], {"type": "null"}]}
            return
    raise KeyError(f"{name}.{member} is not in the document any more: update validate.py")


class Spec:
    def __init__(self, path=SPEC):
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        with open(path, encoding="utf-8") as f:
            doc = yaml.load(f, Loader=loader)
        self.version = doc["info"]["version"]
        self.schemas = _nullable(doc["components"]["schemas"])
        for name, member in NULL_AS_IN_EXAMPLES:
            _allow_null(self.schemas, name, member)
        root = {"components": {"schemas": self.schemas}}
        resource = Resource.from_contents(root, default_specification=DRAFT202012)
        self.registry = Registry().with_resource("urn:openai", resource)
        self._validators = {}
        # Each responses stream event variant, by the `type` it names.
        self.events = {}
        for ref in self.schemas["ResponseStreamEvent"]["anyOf"]:
            name = ref["$ref"].rsplit("/", 1)[1]
            kinds = self.schemas[name].get("properties", {}).get("type", {}).get("enum", [])
            for kind in kinds:
                self.events[kind] = name
        self.closed = {name: self._closes(name) for name in ROOTS.values()}

    def _resolve(self, node):
        """The object schemas `node` stands for, through $ref, allOf, anyOf, oneOf."""
        out, stack = [], [node]
        while stack:
            n = stack.pop()
            if not isinstance(n, dict):
                continue
            ref = n.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                stack.append(self.schemas[ref.rsplit("/", 1)[1]])
            for key in ("allOf", "anyOf", "oneOf"):
                stack.extend(n.get(key) or [])
            if "properties" in n or "additionalProperties" in n:
                out.append(n)
        return out

    def _member(self, node, name):
        return [p["properties"][name] for p in self._resolve(node)
                if name in p.get("properties", {})]

    def _closes(self, name):
        """True when an object the gateway adds members to (the answer itself, its
        `usage`, a model entry) forbids unknown members in `name`'s schema."""
        root = {"$ref": f"#/components/schemas/{name}"}
        places = [root] + self._member(root, "usage")
        places += [d["items"] for d in self._member(root, "data") if "items" in d]
        return any(o.get("additionalProperties") is False or
                   o.get("unevaluatedProperties") is False
                   for place in places for o in self._resolve(place))

    def validator(self, name):
        v = self._validators.get(name)
        if v is None:
            schema = {"$ref": f"urn:openai#/components/schemas/{name}"}
            v = Draft202012Validator(schema, registry=self.registry)
            self._validators[name] = v
        return v

    def check(self, name, value, where, out):
        if self.closed.get(name):
            value = without_extensions(value)
        for e in self.validator(name).iter_errors(value):
            out.append(f"{where}: {name}: {describe(e)}")


def without_extensions(value):
    """A copy of an answer without the gateway's documented extension members."""
    value = copy.deepcopy(value)

    def strip(obj):
        if not isinstance(obj, dict):
            return
        for k in TOP_EXTENSIONS:
            obj.pop(k, None)
        if isinstance(obj.get("usage"), dict):
            obj["usage"].pop("cost", None)
        if isinstance(obj.get("response"), dict):
            strip(obj["response"])
        for entry in obj.get("data") or []:
            if isinstance(entry, dict):
                entry.pop("pricing", None)

    strip(value)
    return value


def _branch(e):
    """For a failed anyOf/oneOf over tagged variants, the errors of the variant
    whose `type` the value names (else jsonschema's best guess)."""
    by_branch = {}
    for sub in e.context:
        by_branch.setdefault(sub.relative_schema_path[0], []).append(sub)
    # A branch of another JSON type (the `null` of "this, or null") is not meant.
    meant = {k: errs for k, errs in by_branch.items()
             if not (len(errs) == 1 and errs[0].validator == "type"
                     and not errs[0].relative_path)}
    if len(meant) == 1:
        return next(iter(meant.values()))
    if isinstance(e.instance, dict) and "type" in e.instance:
        named = [errs for errs in by_branch.values()
                 if not any(list(x.relative_path) == ["type"] or
                            (not x.relative_path and x.validator == "const")
                            for x in errs)]
        if len(named) == 1:
            return named[0]
    return [best_match(e.context)]


def describe(e):
    """The deepest useful reasons, with where in the answer they are."""
    out, stack = [], [e]
    while stack:
        err = stack.pop()
        if err.context:
            stack.extend(_branch(err))
            continue
        path = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        out.append(f"at {path or '(top)'}: {err.message[:300]}")
    return "; ".join(sorted(set(out)))


def sse_events(text):
    """(event name or None, data text) of each SSE event."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            out.append((name, "\n".join(data)))
    return out


def route(path):
    path = path.split("?", 1)[0].rstrip("/")
    if path.startswith("/api/v1/"):
        path = path[4:]
    if not path.startswith("/v1/"):
        path = "/v1" + path
    return path


def has_cost(usage):
    return isinstance(usage, dict) and isinstance(usage.get("cost"), (int, float))


def check_chat_stream(spec, ex, where, out):
    req = json.loads(ex["request"] or "{}")
    include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
    events = sse_events(ex["body"])
    if not events or events[-1][1] != "[DONE]":
        out.append(f"{where}: the stream does not end with [DONE]")
    chunks = []
    for i, (_, data) in enumerate(events):
        if data == "[DONE]":
            if i != len(events) - 1:
                out.append(f"{where}: [DONE] is not last")
            continue
        try:
            chunk = json.loads(data)
        except ValueError:
            out.append(f"{where}: chunk {i} is not JSON: {data[:200]}")
            continue
        if "error" in chunk:
            spec.check("ErrorResponse", chunk, f"{where} chunk {i}", out)
            continue
        spec.check("CreateChatCompletionStreamResponse", chunk, f"{where} chunk {i}", out)
        chunks.append((i, chunk))
    # Issue 28 point 6: where the usage goes; point 8: its cost.
    with_usage = [(i, c) for i, c in chunks if c.get("usage") is not None]
    if include_usage:
        if not chunks:
            return
        last_i, last = chunks[-1]
        if last.get("choices") != [] or last.get("usage") is None:
            out.append(f"{where}: with include_usage the last chunk must carry the usage "
                       f"with choices: [] (chunk {last_i}: {json.dumps(last)[:300]})")
        elif not has_cost(last["usage"]):
            out.append(f"{where}: the stream's final usage lacks usage.cost "
                       f"({json.dumps(last['usage'])[:200]})")
        for i, c in chunks[:-1]:
            if "usage" not in c or c["usage"] is not None:
                out.append(f"{where}: with include_usage every chunk but the last carries "
                           f"\"usage\": null (chunk {i}: {json.dumps(c)[:300]})")
                break
    elif with_usage:
        i, c = with_usage[0]
        out.append(f"{where}: without include_usage no chunk carries a usage "
                   f"(chunk {i}: {json.dumps(c)[:300]})")


def check_responses_stream(spec, ex, where, out):
    events = sse_events(ex["body"])
    last_seq = -1
    final = None
    for i, (name, data) in enumerate(events):
        try:
            event = json.loads(data)
        except ValueError:
            out.append(f"{where}: event {i} is not JSON: {data[:200]}")
            continue
        kind = event.get("type")
        at = f"{where} event {i} ({kind})"
        if name is not None and name != kind:
            out.append(f"{at}: the SSE event name {name!r} is not its type")
        variant = spec.events.get(kind)
        if variant is None:
            out.append(f"{at}: not a ResponseStreamEvent type in the schema")
            continue
        spec.check(variant, event, at, out)
        seq = event.get("sequence_number")
        if isinstance(seq, int):
            if seq <= last_seq:
                out.append(f"{at}: sequence_number {seq} after {last_seq}")
            last_seq = seq
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            final = event
    if final is None:
        out.append(f"{where}: the stream has no response.completed/incomplete/failed event")
    elif final["type"] != "response.failed" and not has_cost(final["response"].get("usage")):
        out.append(f"{where}: the final event's usage lacks usage.cost "
                   f"({json.dumps(final['response'].get('usage'))[:200]})")


def check_messages_stream(ex, where, out):
    """Issue 28 points 8 and 9 on the messages route (Anthropic's format)."""
    start, last_delta = None, None
    for _, data in sse_events(ex["body"]):
        try:
            event = json.loads(data)
        except ValueError:
            out.append(f"{where}: an event is not JSON: {data[:200]}")
            continue
        if event.get("type") == "message_start":
            start = event
        elif event.get("type") == "message_delta":
            last_delta = event
    if start is None or last_delta is None:
        out.append(f"{where}: the stream lacks message_start or message_delta")
        return
    if not start["message"].get("usage", {}).get("input_tokens"):
        out.append(f"{where}: message_start says input_tokens "
                   f"{start['message'].get('usage', {}).get('input_tokens')!r}, "
                   "not the prompt's count")
    if not has_cost(last_delta.get("usage")):
        out.append(f"{where}: the final message_delta's usage lacks usage.cost "
                   f"({json.dumps(last_delta.get('usage'))[:200]})")


def decoded_embeddings(ex, body, where, out):
    """The document types `embedding` as an array of numbers only, though the
    request's `encoding_format: base64` (which it documents) gives a base64 string
    of little-endian float32s, as OpenAI's API does: such a string is checked to be
    that, and validated decoded."""
    req = json.loads(ex["request"] or "{}")
    if req.get("encoding_format") != "base64":
        return body
    body = copy.deepcopy(body)
    for i, entry in enumerate(body.get("data") or []):
        raw = entry.get("embedding") if isinstance(entry, dict) else None
        if not isinstance(raw, str):
            out.append(f"{where}: data[{i}].embedding is not a base64 string though asked")
            continue
        try:
            packed = base64.b64decode(raw, validate=True)
            if not packed or len(packed) % 4:
                raise ValueError(f"{len(packed)} bytes, not whole float32s")
            entry["embedding"] = list(struct.unpack(f"<{len(packed) // 4}f", packed))
        except (ValueError, struct.error) as e:
            out.append(f"{where}: data[{i}].embedding is not base64 float32s: {e}")
            entry["embedding"] = []  # reported once, here
    return body


def check_exchange(spec, n, ex, out):
    path = route(ex["path"])
    where = f"#{n} {ex['method']} {ex['path']} {ex['status']}"
    stream = "text/event-stream" in ex["content_type"]
    openai_route = path in ("/v1/chat/completions", "/v1/responses", "/v1/embeddings",
                            "/v1/models")
    if path == "/v1/messages":
        if ex["status"] == 200 and stream:
            check_messages_stream(ex, where, out)
            return "messages stream"
        return None
    if not openai_route:
        return None
    if ex["status"] >= 400:
        try:
            body = json.loads(ex["body"])
        except ValueError:
            out.append(f"{where}: an error answer that is not JSON: {ex['body'][:200]}")
            return "error"
        spec.check("ErrorResponse", body, where, out)
        return "error"
    if ex["status"] != 200:
        return None
    if stream and path == "/v1/chat/completions":
        check_chat_stream(spec, ex, where, out)
        return "chat stream"
    if stream and path == "/v1/responses":
        check_responses_stream(spec, ex, where, out)
        return "responses stream"
    try:
        body = json.loads(ex["body"])
    except ValueError:
        out.append(f"{where}: a 200 answer that is not JSON: {ex['body'][:200]}")
        return None
    if path == "/v1/embeddings":
        body = decoded_embeddings(ex, body, where, out)
    name = {"/v1/chat/completions": "CreateChatCompletionResponse",
            "/v1/responses": "Response",
            "/v1/embeddings": "CreateEmbeddingResponse",
            "/v1/models": "ListModelsResponse"}[path]
    spec.check(name, body, where, out)
    if path in ("/v1/chat/completions", "/v1/responses") and not has_cost(body.get("usage")):
        out.append(f"{where}: the answer's usage lacks usage.cost")
    return name


def main(paths):
    spec = Spec()
    closed = [k for k, v in spec.closed.items() if v]
    print(f"openapi {spec.version}: "
          + (f"{', '.join(closed)} close objects: validated without the gateway's extension "
             "members" if closed else
             "no checked schema closes an object: answers validated as they are, "
             "extension members included"))
    out, counts = [], {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            exchanges = json.load(f)
        for n, ex in enumerate(exchanges):
            kind = check_exchange(spec, n, ex, out)
            if kind:
                counts[kind] = counts.get(kind, 0) + 1
    print("checked: " + (", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "nothing"))
    for line in out:
        print("SCHEMA " + line)
    if out:
        print(f"{len(out)} schema violation(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
