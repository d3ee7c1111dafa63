"""What every door of the OpenAI API promises for any request body, and the bodies that test it.

Shared by the property tests (``tests/property/test_doors.py``) and the long-run fuzzer
(``scripts/fuzz_doors.py``). Three parts:

- **strategies**: request bodies over every field the parser reads for ``/v1/chat/completions``,
  ``/v1/completions`` and llama-server's ``/completion`` (plus the ones it refuses and unknown extras), built as *a valid body
  with 0-2 fields replaced by hostile values*, so that most examples reach the engine and the
  hostile ones still cover every field; raw bodies (invalid JSON, deep nesting, bad UTF-8,
  numbers past every limit); and a strategy of huge generation limits;
- **exchange**: send one body to a door with a total deadline and classify what came back;
- **the invariant**: the answer is a 2xx with a well-formed OpenAI body (or SSE stream ending in
  ``data: [DONE]``; for ``/completion`` llama-server's body, or a stream ending in an event with
  ``stop: true``) or a 4xx/503 with OpenAI error JSON; afterwards every engine is alive, no
  slot is busy and nothing is queued, the coordinator counts no request in flight, and a normal
  request is served.

Strings are encoded with ``json.dumps(..., ensure_ascii=True, allow_nan=True)``: a lone surrogate
travels as ``"\\ud800"`` (valid JSON, invalid Unicode once decoded) and NaN/Infinity as the
literals Python's JSON reader accepts. ``st.text()`` does not draw surrogates by itself, so the
alphabet here adds them (and control characters) explicitly.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import httpx
from hypothesis import assume
from hypothesis import strategies as st

MAX_BODY = 1 << 20  # no generated body is larger than 1 MiB
CLIENT_TIMEOUT = 30.0  # a door that has not answered (or finished its stream) by then hangs
SETTLE_S = 5.0  # how long an engine may take to free a slot and forget a request after the answer ended
SMALL_LIMIT = 8  # max_tokens of the examples that are meant to be served

MODEL = "smollm2-135m"
MODEL_NAMES = [MODEL, "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1"]
ROLES = ["system", "user", "assistant", "developer", "tool"]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
NATIVE = "/completion"
INFILL = "/infill"  # llama-server's fill in the middle: /completion's fields and answers
EMBEDDINGS = "/v1/embeddings"
MESSAGES = "/v1/messages"  # Anthropic's Messages API: its own shapes, errors included
NATIVE_EMBEDDING = "/embedding"
N_EMBD = 576  # SmolLM2's embedding width
N_VOCAB = 49152  # SmolLM2's: token-id prompts are drawn on both sides of it


# ----- values ------------------------------------------------------------------------------

SURROGATES = ["\ud800", "\udbff", "\udc00", "\udfff"]
SPECIAL_STRINGS = [
    "", " ", "\x00", "\x7f", "\x1b[2J", "\r\n", "\t", "\u2028", "\u2029", "\ufeff", "\ufffd", "\uffff",
    "\U0001f600", "\U0010ffff", "e\u0301", "<|im_end|>", "<|im_start|>assistant\n", "<|endoftext|>", "</s>",
    "{{ raise_exception('x') }}", "{% for m in messages %}", "%s%n%x", "\\", '"', "null", "\\ud800",
    "a\ud800b", "\udfff\ud800", "\ud83d", "\ud800" * 3, "x" * 257,
]

_any_char = st.characters()  # every category but surrogates
_alphabet = st.one_of(  # one_of picks a branch about uniformly: surrogates are in ~1 character of 7
    _any_char, _any_char, _any_char, _any_char,
    st.characters(categories=["Cs"]),  # lone surrogates
    st.characters(categories=["Cc"]),  # control characters, NUL included
    st.sampled_from("ab <>|/\\\"'{}%\n"),
)
short_text = st.one_of(st.text(_alphabet, max_size=24), st.sampled_from(SPECIAL_STRINGS), st.text(max_size=12))


@st.composite
def long_text(draw: st.DrawFn) -> str:
    """A long string (up to ~900 kB once JSON-escaped), so a body stays within MAX_BODY."""
    unit = draw(st.sampled_from(["a", "ab ", "\ud800", "\u00e9", "<|im_end|>", "\x00", "\U0001f600", "0123456789"]))
    escaped = len(json.dumps(unit, ensure_ascii=True)) - 2
    n = draw(st.integers(min_value=1, max_value=900_000 // escaped))
    return unit * n


text = st.one_of(short_text, short_text, short_text, long_text())

HUGE_INTS = [2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**31) - 1, -(2**63) - 1, 10**30, 10**300]
ODD_FLOATS = [math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -0.0, 1e-300, 0.5, 2.0000001]
numbers = st.one_of(
    st.integers(-10, 10), st.floats(-3, 3), st.sampled_from(HUGE_INTS), st.sampled_from(ODD_FLOATS),
    st.floats(allow_nan=True, allow_infinity=True), st.integers(),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, short_text)
any_json = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(short_text, inner, max_size=4)),
                        max_leaves=8)
"""Any JSON value: the wrong type for almost every field."""

# A JSON value for max_tokens that the parser must refuse (never one it could coerce into a big
# limit: a refused field is what this strategy is for, a long generation is the limits test's job).
bad_limit = st.one_of(
    st.integers(max_value=-1), st.sampled_from([math.nan, math.inf, -math.inf, 0.5, -0.0001, 1e-300]),
    st.sampled_from(["", "eight", "8 tokens", "\ud800", "0x10", "[]"]),
    st.lists(st.integers(0, 4), max_size=2), st.dictionaries(short_text, st.integers(0, 4), max_size=2),
)


# ----- fields ------------------------------------------------------------------------------

def _part(kind: str) -> st.SearchStrategy[Any]:
    if kind == "text":
        return st.fixed_dictionaries({"type": st.just("text"), "text": text})
    if kind == "image_url":
        return st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries(
            {"url": st.sampled_from(["data:image/png;base64,iVBORw0KGgo=", "http://127.0.0.1:9/x.png", ""])},
            optional={"detail": st.sampled_from(["auto", "low", "high"])})})
    if kind == "input_audio":
        return st.fixed_dictionaries({"type": st.just("input_audio"),
                                      "input_audio": st.fixed_dictionaries({"data": st.just("UklGRg=="),
                                                                            "format": st.sampled_from(["wav", "mp3"])})})
    if kind == "file":
        return st.fixed_dictionaries({"type": st.just("file"), "file": st.fixed_dictionaries({"file_id": short_text})})
    if kind == "refusal":
        return st.fixed_dictionaries({"type": st.just("refusal"), "refusal": short_text})
    return any_json


text_part = _part("text")
any_part = st.one_of(text_part, text_part, _part("image_url"), _part("input_audio"), _part("file"), _part("refusal"),
                     st.fixed_dictionaries({"type": st.just("text"), "text": any_json}),
                     st.fixed_dictionaries({"text": text}), any_json)

valid_content = st.one_of(text, text, st.none(), st.lists(text_part, max_size=3))
any_content = st.one_of(valid_content, st.lists(any_part, min_size=1, max_size=3), any_json)

tool_call = st.fixed_dictionaries({"id": short_text, "type": st.just("function"),
                                   "function": st.fixed_dictionaries({"name": short_text, "arguments": short_text})})


def _message(role: st.SearchStrategy[Any], content: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"role": role, "content": content},
                                 optional={"name": short_text, "tool_calls": st.lists(tool_call, max_size=2),
                                           "tool_call_id": short_text, "refusal": st.none()})


valid_message = _message(st.sampled_from(ROLES), valid_content)
valid_messages = st.one_of(
    st.lists(valid_message, min_size=1, max_size=4),
    st.builds(lambda m: [{"role": "user", "content": m}], text),
)
any_messages = st.one_of(
    st.lists(st.one_of(valid_message, _message(st.one_of(st.sampled_from(ROLES), any_json), any_content),
                       st.fixed_dictionaries({}, optional={"role": st.sampled_from(ROLES), "content": any_content}),
                       any_json), max_size=4),
    any_json,
)

tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": short_text}, optional={"description": short_text,
                                    "parameters": st.just({"type": "object", "properties": {"x": {"type": "string"}}})})})
# Tools the doors accept (unique names of OpenAI's alphabet, schemas a grammar can be made of), and
# the hostile ones: bad names and shapes, schemas no grammar comes from, too many, special-token text.
TOOL_NAMES = ["get_weather", "lookup", "f", "x-1", "A" * 64]
valid_parameters = st.sampled_from([
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]},
    {"type": "object", "properties": {"n": {"type": "integer"}, "on": {"type": "boolean"}}},
    {"type": "object", "properties": {}}, {"type": "object"},
])
valid_tools = st.lists(st.sampled_from(TOOL_NAMES), min_size=1, max_size=3, unique=True).flatmap(
    lambda names: st.tuples(*[st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.just(n)}, optional={"description": text, "parameters": valid_parameters})}) for n in names]).map(list))
hostile_tools = st.one_of(
    st.lists(tool, min_size=1, max_size=2), any_json,
    st.builds(lambda t, s: [{"type": "function", "function": {"name": "f", "parameters": s}}, *t],
              st.lists(tool, max_size=1), st.deferred(lambda: hostile_schemas)),
    st.builds(lambda d: [{"type": "function", "function": {"name": "f", "description": d}}],
              st.sampled_from(["<|im_end|><|im_start|>system\n", "d" * 9000, "\ud800", "{{ raise_exception('x') }}"])),
    st.just([{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]),
    st.just([{"type": "function", "function": {"name": "f"}}] * 2),
    st.lists(st.fixed_dictionaries({"type": any_json, "function": any_json}), min_size=1, max_size=2),
)
response_formats = st.one_of(
    st.just({"type": "text"}), st.just({"type": "json_object"}),
    st.just({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}),
    st.fixed_dictionaries({"type": short_text}),
    st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": any_json}),
    st.fixed_dictionaries({"type": st.just("json_object"), "schema": any_json}),
)
valid_grammars = st.sampled_from(['root ::= "yes" | "no"', "root ::= [a-z]{1,8}", 'root ::= [0-9]+ ("," [0-9]+)*',
                                  'root ::= "a" | [^\\n]+', "root ::= <[1]> | .", ""])
valid_schemas = st.sampled_from([{}, {"type": "object"}, {"type": "integer"}, {"enum": ["a", "b"]},
                                 {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}])
# What the doors' grammar checker must refuse (each of these once crashed, hung or flooded
# llama.cpp's parser or sampler) and what llama.cpp itself refuses; all a 400, the engine unharmed.
hostile_grammars = st.one_of(
    st.sampled_from([
        "root ::= " + "(" * 30000 + '"a"' + ")" * 30000,  # the parser's recursion: a stack overflow
        'root ::= "' + "x" * 60000 + '"{1999}',  # a gigabyte of rule elements
        'root ::= "a"{5,2}', 'root ::= "a"{99999999999999999999}', 'root ::= "' + "y" * 70000 + '"',
        "root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} "a" | r{i + 1} "b"\n' for i in range(30)) + 'r30 ::= "x"',
        'root ::= root "a" | "b"', "root ::= <not-one-token-here>", "root ::= <[99999999999]>", 'root ::= "\\x"',
        'root ::= "a"\x00 junk', "root ::= undefined", 'x ::= "no root"', "root ::= [", "root ::= (", "",
    ]),
    st.text(alphabet='root:=|"()[]{}<>!^-*+?,.#ab01\\ \n\t', max_size=40),
    any_json,
)
hostile_schemas = st.one_of(
    st.sampled_from([{"type": "bogus"}, {"$ref": "#/nowhere"}, {"type": "string", "pattern": "(("},
                     {"type": "object", "properties": {"a": {"$ref": "#"}}}, {"type": "array", "minItems": 10**9},
                     {"type": "object", "description": "d" * 70000}, {"anyOf": "x"}, {"enum": [{"a": [1]}]}]),
    any_json,
)

# Per field: values of the right type and range (hostile content allowed: surrogates, control
# characters, huge but valid numbers), and values that must be refused or that are wrong types.
VALID: dict[str, st.SearchStrategy[Any]] = {
    "model": st.one_of(st.sampled_from(MODEL_NAMES), st.sampled_from(MODEL_NAMES), short_text, st.none()),
    "max_completion_tokens": st.one_of(*[st.integers(0, SMALL_LIMIT)] * 3, st.sampled_from(HUGE_INTS[:9]), st.none()),
    "n_predict": st.one_of(*[st.integers(-1, SMALL_LIMIT)] * 3, st.sampled_from(HUGE_INTS[:9]), st.none()),
    "temperature": st.one_of(st.floats(0, 2), st.sampled_from([0, 2, 5e-324, 1e-300]), st.none()),
    "top_p": st.one_of(st.floats(0, 1), st.sampled_from([0, 1, 5e-324]), st.none()),
    "top_k": st.one_of(*[st.integers(0, 100)] * 3, st.sampled_from(HUGE_INTS[:9]), st.none()),
    "min_p": st.one_of(st.floats(0, 1), st.none()),
    "repeat_penalty": st.one_of(st.floats(0, 3), st.sampled_from([0, 1, 1.1, 1e308, 5e-324]), st.none()),
    "frequency_penalty": st.one_of(st.floats(-2, 2), st.sampled_from([-2, 0, 0.5, 2])),
    "presence_penalty": st.one_of(st.floats(-2, 2), st.sampled_from([-2, 0, 0.5, 2])),
    "seed": st.one_of(*[st.integers(0, 2**32 - 1)] * 3, st.integers(-(2**63), 2**64), st.sampled_from(HUGE_INTS),
                      st.just(-1), st.none()),
    "stop": st.one_of(text, st.lists(text, max_size=5), st.none()),
    "stream": st.booleans(),
    "stream_options": st.one_of(st.none(), st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
                                st.dictionaries(short_text, any_json, max_size=2)),
    "n": st.just(1),
    "user": st.one_of(short_text, st.none(), text),
    "id_slot": st.one_of(*[st.integers(-1, 3)] * 3, st.sampled_from(HUGE_INTS[:9]), st.none()),
    "ignore_eos": st.booleans(),
    "response_format": st.one_of(st.just({"type": "text"}), st.none(), st.just({"type": "json_object"}),
                                 st.builds(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}},
                                           valid_schemas)),
    "grammar": st.one_of(st.none(), valid_grammars),
    "json_schema": st.one_of(st.none(), valid_schemas),
    # each endpoint reads its own: chat a boolean (and top_logprobs), legacy completions an integer,
    # /completion n_probs; the others' fields are refused by name unless neutral
    "logprobs": st.one_of(st.none(), st.booleans(), st.integers(0, 5)),
    "top_logprobs": st.one_of(st.none(), st.integers(0, 20)),
    "post_sampling_probs": st.one_of(st.none(), st.just(False)),
    "tools": st.one_of(st.none(), st.just([]), valid_tools),
    "tool_choice": st.one_of(st.none(), st.sampled_from(["none", "auto"])),
    "parallel_tool_calls": st.one_of(st.none(), st.booleans()),
    "logit_bias": st.one_of(st.none(), st.just({})),
    "session_id": st.one_of(short_text, st.none(), st.just(""), text),
    "cache_prompt": st.booleans(),
    "return_tokens": st.booleans(),
    "return_progress": st.booleans(),
    "n_probs": st.one_of(st.none(), st.integers(0, 20), st.just(100)),
    # a chat's thinking (refused by name elsewhere unless neutral)
    "reasoning_format": st.sampled_from([None, "none", "deepseek", "deepseek-legacy", "auto"]),
    "reasoning_budget_tokens": st.one_of(st.none(), st.integers(-1, 4)),
    "chat_template_kwargs": st.one_of(st.none(), st.just({}), st.fixed_dictionaries(
        {}, optional={"enable_thinking": st.booleans(), "persona": short_text})),
}
HOSTILE: dict[str, st.SearchStrategy[Any]] = {
    "model": any_json,
    "messages": any_messages,
    "prompt": any_json,
    "max_tokens": bad_limit,
    "max_completion_tokens": any_json,
    "n_predict": any_json,
    "stop": st.one_of(st.lists(text, min_size=5, max_size=8), st.lists(any_json, min_size=1, max_size=3), any_json),
    "n": st.one_of(st.integers(-3, 5), st.sampled_from(HUGE_INTS), any_json),
    "response_format": st.one_of(response_formats, any_json),
    "grammar": hostile_grammars,
    "json_schema": hostile_schemas,
    "logprobs": st.one_of(st.sampled_from([-1, 6, 21, "yes", "1", 1e9, 2**31, 2**64, 1.5, math.nan]), any_json),
    "top_logprobs": st.one_of(st.sampled_from([-1, 21, "x", "3", 1e9, 2**63, True, 2.0, math.inf]), any_json),
    "post_sampling_probs": st.one_of(st.just(True), any_json),
    "tools": hostile_tools,
    "tool_choice": st.one_of(st.sampled_from(["auto", "required"]),
                             st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
                                 {"name": st.one_of(short_text, st.sampled_from(TOOL_NAMES))})}), any_json),
    "parallel_tool_calls": any_json,
    "logit_bias": st.one_of(st.dictionaries(st.integers(0, 60000).map(str), numbers, min_size=1, max_size=3), any_json),
    "stream_options": any_json,
    "id_slot": st.one_of(st.integers(max_value=-2), st.integers(2, 64), any_json),
    "return_tokens": any_json,
    "return_progress": st.one_of(st.sampled_from(["true", 1, 0, "false", None, [True]]), any_json),
    "cache_prompt": any_json,
    "n_probs": st.one_of(st.sampled_from([-1, 101, "x", "5", 1e9, 2**63, True, 2.5, math.nan]),
                         st.integers(101, 2**40), any_json),
    "reasoning_format": st.one_of(short_text, any_json),
    "reasoning_budget_tokens": st.one_of(st.sampled_from([-2, 2**31, 2**64, "3", 1.5, True]), any_json),
    "thinking_budget_tokens": st.one_of(st.integers(-3, 5), any_json),
    "chat_template_kwargs": st.one_of(
        st.dictionaries(st.one_of(short_text, st.sampled_from(["messages", "tools", "bos_token"])), any_json,
                        max_size=3),
        st.just({"persona": "<|im_end|><|im_start|>system\n"}), st.just({f"k{i}": i for i in range(40)}),
        any_json),
}
# /completion's prompt: a string, token ids (some past the vocabulary, negative or huge), or one of
# those in a list; and what it refuses (several prompts, mixed, multimodal objects).
token_ids = st.lists(st.integers(0, N_VOCAB - 1), min_size=1, max_size=24)
valid_native_prompt = st.one_of(text, token_ids, st.lists(text, min_size=1, max_size=1), token_ids.map(lambda t: [t]))
hostile_native_prompt = st.one_of(
    st.lists(st.one_of(st.integers(-5, N_VOCAB + 5), st.sampled_from(HUGE_INTS), st.booleans(), st.floats()),
             min_size=0, max_size=12),
    st.lists(st.one_of(st.integers(0, 100), short_text), min_size=2, max_size=4),
    st.lists(token_ids, min_size=2, max_size=3),
    st.fixed_dictionaries({"prompt_string": short_text}, optional={"multimodal_data": st.lists(short_text, max_size=2)}),
    any_json,
)
FIELDS = sorted(set(VALID) | set(HOSTILE) | {"max_tokens"})
# /infill's own fields: the text around the gap (strings, or strings and token ids), the project's
# other files, the start of the middle; and what each must refuse
fim_text = st.one_of(text, st.lists(st.one_of(short_text, st.integers(0, N_VOCAB - 1)), max_size=6))
extra_chunk = st.fixed_dictionaries({"text": text}, optional={"filename": short_text})
INFILL_VALID: dict[str, st.SearchStrategy[Any]] = {
    "input_extra": st.lists(extra_chunk, max_size=4),
    "prompt": short_text,
}
INFILL_HOSTILE: dict[str, st.SearchStrategy[Any]] = {
    "input_prefix": st.one_of(hostile_native_prompt, st.lists(st.integers(N_VOCAB, 2**40), min_size=1, max_size=3)),
    "input_suffix": st.one_of(hostile_native_prompt, st.just([-1])),
    "input_extra": st.one_of(st.lists(any_json, min_size=1, max_size=3), st.just([{"text": "x"}] * 1025),
                             st.fixed_dictionaries({"text": any_json}, optional={"filename": any_json}).map(
                                 lambda c: [c]), any_json),
    "prompt": st.one_of(token_ids, any_json),
}
REFUSED = ["functions", "function_call", "best_of", "echo", "suffix", "audio", "modalities",
           "prediction", "reasoning_effort", "metadata", "store", "service_tier"]

# X-Session-Id values an HTTP client can put on the wire (latin-1, no CR/LF/NUL), long ones included
header_value = st.one_of(
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=24),
    st.integers(250, 300).map(lambda n: "s" * n), st.just(""),
).map(lambda v: v.strip(" \t"))  # an HTTP client cannot send leading or trailing blanks
headers = st.one_of(st.just({}), st.fixed_dictionaries({"X-Session-Id": header_value}))


@dataclass
class Case:
    """One request: path, raw body bytes, extra headers, and (for the report) how the body was made."""

    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def describe(self, limit: int = 600) -> str:
        text_ = self.body.decode("utf-8", "backslashreplace")
        if len(text_) > limit:
            text_ = f"{text_[:limit]}... ({len(self.body)} bytes)"
        hdr = f" headers={self.headers}" if self.headers else ""
        return f"POST {self.path}{hdr} body={text_}{' (' + self.note + ')' if self.note else ''}"


def encode(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=True, allow_nan=True).encode("ascii")


@st.composite
def bodies(draw: st.DrawFn, kind: str) -> Case:
    """A body for ``kind`` ("chat", "completion" or "native", llama-server's /completion): valid
    fields (each present or not), max_tokens small (llama-server reads it as n_predict), then 0-2
    fields replaced by hostile values (none in half the bodies), unknown fields included."""
    base: dict[str, Any] = {"max_tokens": st.integers(0, SMALL_LIMIT)}
    optional, fields = VALID, FIELDS
    if kind == "infill":
        base.update(input_prefix=fim_text, input_suffix=fim_text)
        optional = {**{k: v for k, v in VALID.items() if k != "prompt"}, **INFILL_VALID}
        fields = sorted(set(FIELDS) | set(INFILL_HOSTILE))
    else:
        base["messages" if kind == "chat" else "prompt"] = (
            valid_messages if kind == "chat" else valid_native_prompt if kind == "native"
            else st.one_of(text, st.lists(text, min_size=1, max_size=1)))
    body: dict[str, Any] = draw(st.fixed_dictionaries(base, optional=optional))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # half the bodies have no hostile field
        name = draw(st.sampled_from(fields + ["prompt" if kind == "chat" else "messages", "<refused>", "<unknown>"]))
        if kind == "infill" and name in INFILL_HOSTILE:
            body[name] = draw(INFILL_HOSTILE[name])
        elif name == "<refused>":
            body[draw(st.sampled_from(REFUSED))] = draw(any_json)
        elif name == "<unknown>":
            body[draw(short_text)] = draw(any_json)
        elif name == "prompt" and kind == "native":
            body[name] = draw(hostile_native_prompt)
        else:
            body[name] = draw(HOSTILE.get(name, any_json))
    if kind == "completion" and isinstance(body.get("prompt"), list) and draw(st.booleans()):
        body["prompt"] = draw(st.lists(text, min_size=0, max_size=3))
    raw = encode(body)
    assume(len(raw) <= MAX_BODY)  # rare: two long strings
    return Case({"chat": CHAT, "completion": COMPLETIONS, "infill": INFILL}.get(kind, NATIVE), raw, draw(headers))


# Anthropic's Messages API: a conversation (with tool use in the history or not), tools and
# tool_choice in Anthropic's shapes, the sampling fields Anthropic defines; and what each refuses.
anthropic_tools = st.lists(st.sampled_from(TOOL_NAMES), min_size=1, max_size=3, unique=True).flatmap(
    lambda names: st.tuples(*[st.fixed_dictionaries({"name": st.just(n), "input_schema": valid_parameters},
                                                     optional={"description": text, "type": st.just("custom"),
                                                               "cache_control": st.just({"type": "ephemeral"})})
                              for n in names]).map(list))
anthropic_choice = st.one_of(
    st.none(), st.just({"type": "none"}),
    st.fixed_dictionaries({"type": st.sampled_from(["auto", "any"])},
                          optional={"disable_parallel_tool_use": st.booleans()}),
    st.fixed_dictionaries({"type": st.just("tool"), "name": st.just(TOOL_NAMES[0])},
                          optional={"disable_parallel_tool_use": st.booleans()}),
)
text_block = st.fixed_dictionaries({"type": st.just("text"), "text": text})
tool_use_block = st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.just("toolu_1"),
                                        "name": st.just(TOOL_NAMES[0]),
                                        "input": st.sampled_from([{}, {"city": "Paris"}, {"n": 3, "on": True}])})
tool_result_block = st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.just("toolu_1")},
                                          optional={"content": st.one_of(text, st.lists(text_block, max_size=2)),
                                                    "is_error": st.booleans()})
anthropic_history = st.one_of(
    st.builds(lambda t: [{"role": "user", "content": t}], st.one_of(text, st.lists(text_block, min_size=1, max_size=2))),
    st.builds(lambda a, u, r, after: [{"role": "user", "content": a}, {"role": "assistant", "content": [*u]},
                                      {"role": "user", "content": [r, *after]}],
              text, st.lists(text_block, max_size=1).map(lambda b: [*b, None]).flatmap(
                  lambda b: tool_use_block.map(lambda u: [x for x in b if x] + [u])),
              tool_result_block, st.lists(text_block, max_size=1)),
)
hostile_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("tool_use")}, optional={"id": any_json, "name": any_json, "input": any_json}),
    st.fixed_dictionaries({"type": st.just("tool_result")},
                          optional={"tool_use_id": any_json, "content": any_json, "is_error": any_json}),
    st.fixed_dictionaries({"type": st.sampled_from(["image", "document", "thinking", "server_tool_use", "text"])},
                          optional={"text": any_json, "source": any_json}),
    any_json,
)
hostile_anthropic_messages = st.one_of(
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]),
                                    "content": st.one_of(st.lists(hostile_block, min_size=1, max_size=3), any_json)}),
             min_size=1, max_size=3),
    st.just([{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]),
    st.just([{"role": "assistant", "content": [{"type": "tool_use", "id": "t" * 300, "name": "f", "input": {}}]},
             {"role": "user", "content": "x"}]),
    st.just([{"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "f", "input": {}}
                                               for i in range(65)]}, {"role": "user", "content": "x"}]),
    any_json,
)
hostile_anthropic_tools = st.one_of(
    any_json, st.lists(any_json, min_size=1, max_size=2),
    st.builds(lambda s: [{"name": "f", "input_schema": s}], st.one_of(hostile_schemas, st.just({"type": "string"}))),
    st.builds(lambda n: [{"name": n, "input_schema": {"type": "object"}}], st.one_of(short_text, any_json)),
    st.builds(lambda d: [{"name": "f", "description": d, "input_schema": {"type": "object"}}],
              st.sampled_from(["<|im_end|><|im_start|>system\n", "d" * 9000, "\ud800", 7])),
    st.just([{"type": "web_search_20250305", "name": "web_search", "max_uses": 1}]),
    st.just([{"name": f"f{i}", "input_schema": {"type": "object"}} for i in range(129)]),
    st.just([{"name": "f", "input_schema": {"type": "object"}}] * 2),
    st.just([{"name": "f", "input_schema": {"type": "object"}, "strict": True}]),
)
hostile_anthropic_choice = st.one_of(
    st.sampled_from(["auto", "any", "required", {"type": "required"}, {"type": "tool"}, {"type": "function"},
                     {"type": "none", "disable_parallel_tool_use": True}]),
    st.fixed_dictionaries({"type": st.just("tool"), "name": st.one_of(short_text, any_json)},
                          optional={"disable_parallel_tool_use": any_json}),
    st.fixed_dictionaries({"type": st.sampled_from(["auto", "any"]), "disable_parallel_tool_use": any_json}),
    any_json,
)
VALID_MESSAGES: dict[str, st.SearchStrategy[Any]] = {
    "model": VALID["model"], "system": st.one_of(text, st.lists(text_block, max_size=2)),
    "stop_sequences": st.lists(text, max_size=4), "temperature": st.one_of(st.floats(0, 1), st.none()),
    "top_p": VALID["top_p"], "top_k": VALID["top_k"], "stream": st.booleans(),
    "metadata": st.one_of(st.none(), st.just({"user_id": "u1"})),
    "tools": st.one_of(st.none(), st.just([]), anthropic_tools), "tool_choice": anthropic_choice,
    "thinking": st.one_of(st.none(), st.just({"type": "disabled"}),
                          st.builds(lambda n: {"type": "enabled", "budget_tokens": n}, st.integers(1, 3))),
}
HOSTILE_MESSAGES: dict[str, st.SearchStrategy[Any]] = {
    "model": any_json, "max_tokens": st.one_of(bad_limit, st.just(0), st.none()), "messages": hostile_anthropic_messages,
    "system": st.one_of(st.lists(hostile_block, min_size=1, max_size=2), any_json),
    "stop_sequences": HOSTILE["stop"], "temperature": st.one_of(st.sampled_from([-1, 1.5, math.nan, "0"]), any_json),
    "top_k": any_json, "stream": any_json, "tools": hostile_anthropic_tools, "tool_choice": hostile_anthropic_choice,
    "thinking": any_json, "mcp_servers": any_json, "service_tier": any_json,
}


@st.composite
def messages_bodies(draw: st.DrawFn) -> Case:
    """A /v1/messages body: a valid conversation and fields (each present or not), then 0-2 fields
    replaced by hostile values (none in half the bodies), unknown fields included."""
    body: dict[str, Any] = draw(st.fixed_dictionaries(
        {"max_tokens": st.integers(1, SMALL_LIMIT), "messages": anthropic_history}, optional=VALID_MESSAGES))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        name = draw(st.sampled_from(sorted(HOSTILE_MESSAGES) + ["<unknown>"]))
        if name == "<unknown>":
            body[draw(short_text)] = draw(any_json)
        else:
            body[name] = draw(HOSTILE_MESSAGES[name])
    raw = encode(body)
    assume(len(raw) <= MAX_BODY)
    return Case(MESSAGES, raw, draw(headers))


# The embedding endpoints (the doors' engines load SmolLM2 with embeddings: true, pooling: mean):
# inputs in every shape llama-server takes, each field valid or hostile.
embed_input = st.one_of(text, token_ids, st.lists(st.one_of(text, token_ids), min_size=1, max_size=4))
hostile_embed_input = st.one_of(
    hostile_native_prompt, st.lists(st.one_of(text, token_ids), min_size=0, max_size=3),
    st.integers(2049, 2300).map(lambda n: ["a"] * n),  # more inputs than a request may carry
    st.integers(1, 3).map(lambda n: ["word " * 700] * n),  # longer than the embedding context
    st.lists(st.lists(st.integers(-5, N_VOCAB + 5), max_size=4), min_size=1, max_size=3), any_json,
)
VALID_EMBED: dict[str, st.SearchStrategy[Any]] = {
    "model": VALID["model"], "user": VALID["user"],
    "encoding_format": st.sampled_from(["float", "base64", None]),
    "dimensions": st.sampled_from([None, N_EMBD]),
    "embd_normalize": st.one_of(st.none(), st.integers(-1, 4), st.just(32)),
}
HOSTILE_EMBED: dict[str, st.SearchStrategy[Any]] = {
    "model": any_json, "user": any_json, "encoding_format": st.one_of(short_text, any_json),
    "dimensions": st.one_of(st.integers(-3, 4096), st.sampled_from(HUGE_INTS), any_json),
    "embd_normalize": st.one_of(st.integers(-(2**40), 2**40), st.sampled_from(HUGE_INTS + ODD_FLOATS), any_json),
}


@st.composite
def embedding_bodies(draw: st.DrawFn, kind: str) -> Case:
    """A body for OpenAI's /v1/embeddings ("openai") or llama-server's /embedding ("native", whose
    text is ``content`` and which takes no ``encoding_format``, ``dimensions`` or ``user``): valid
    fields, then 0-2 replaced by hostile values, unknown fields included."""
    name = "input" if kind == "openai" or draw(st.booleans()) else "content"
    fields = VALID_EMBED if kind == "openai" else {k: VALID_EMBED[k] for k in ("model", "embd_normalize")}
    body: dict[str, Any] = draw(st.fixed_dictionaries({name: embed_input}, optional=fields))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        field_ = draw(st.sampled_from(sorted(HOSTILE_EMBED) + [name, "<unknown>"]))
        if field_ == "<unknown>":
            body[draw(short_text)] = draw(any_json)
        elif field_ == name:
            body[name] = draw(hostile_embed_input)
        else:
            body[field_] = draw(HOSTILE_EMBED[field_])
    raw = encode(body)
    assume(len(raw) <= MAX_BODY)
    return Case(EMBEDDINGS if kind == "openai" else NATIVE_EMBEDDING, raw, draw(headers))


def _nest(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


RAW_BODIES: list[tuple[bytes, str]] = [
    (b"", "empty"), (b"null", "null"), (b"[]", "array"), (b'"hello"', "string"), (b"1e999", "huge float literal"),
    (b"{", "truncated"), (b"{}", "empty object"), (b"NaN", "NaN literal"), (b"\xef\xbb\xbf{}", "BOM"),
    (b"[" * 10_000, "10,000 unclosed ["), (_nest(10_000).encode(), "10,000 nested lists"),
    (b'{"a":' * 10_000 + b"1" + b"}" * 10_000, "10,000 nested objects"),
    (b'{"messages":' + _nest(10_000, '{"role":"user","content":"hi"}').encode() + b"}", "deep messages"),
    (b'{"prompt":' + _nest(5_000, '"hi"').encode() + b',"max_tokens":2}', "deep prompt"),
    (b'{"prompt":"hi","max_tokens":1' + b"0" * 5000 + b"}", "5000-digit integer"),
    (b'{"prompt":"hi","max_tokens":2,"seed":-' + b"9" * 4000 + b"}", "4000-digit negative seed"),
    (b'{"prompt":"hi","max_tokens":2,"temperature":NaN}', "NaN temperature"),
    (b'{"prompt":"hi","max_tokens":2,"top_p":Infinity}', "Infinity top_p"),
    (b'{"prompt":"hi","max_tokens":2,"repeat_penalty":-Infinity}', "-Infinity repeat_penalty"),
    (b'{"prompt":"\xff\xfe","max_tokens":2}', "invalid UTF-8"), (b'{"prompt":"\xed\xa0\x80","max_tokens":2}', "UTF-8 surrogate"),
    (b'{"prompt":"\\ud800","max_tokens":2}', "escaped lone surrogate"),
    (b'{"prompt":"hi","prompt":"\\udfff","max_tokens":2}', "duplicate key"),
    (b'{"messages":[{"role":"user","content":"\\u0000"}],"max_tokens":2}', "NUL content"),
    (b'{"prompt":"hi","max_tokens":2}' + b" " * 1000 + b"x", "trailing garbage"),
    (b"\x00" * 4096, "NUL bytes"),
    (b" " * (MAX_BODY - 40) + b'{"prompt":"hi","max_tokens":2}', "1 MiB of whitespace"),
    (b'{"prompt":"' + b"a" * (MAX_BODY - 40) + b'","max_tokens":2}', "1 MiB prompt"),
    (b'{"prompt":"hi","max_tokens":2,"stop":"' + b"\\ud800" * 150_000 + b'"}', "900 kB stop of surrogates"),
    (b'{"prompt":"hi","max_tokens":2,"stop":["' + b"x" * 200_000 + b'","' + b"y" * 200_000 + b'"]}', "two 200 kB stops"),
    (b'{"prompt":"hi","max_tokens":2,"stop":"' + b"z" * 150_000 + b'"}', "150 kB stop"),
    (b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stop":["' + b"w" * 150_000 + b'"]}', "150 kB chat stop"),
    (b'{"messages":[{"role":"user","content":"\\ud800"}],"max_tokens":2}', "surrogate content"),
    (b'{"prompt":"hi","max_tokens":2,"model":"\\udfff"}', "surrogate model"),
    (b'{"prompt":"hi","max_tokens":2,"session_id":"\\ud800"}', "surrogate session_id"),
    (b'{"prompt":"hi","max_tokens":2,"\\ud800":1}', "surrogate key"),
]


def raw_path(body: bytes) -> str | None:
    """The endpoint a fixed raw body is meant for (None: either)."""
    found = [(i, path) for i, path in ((body.find(b'"prompt"'), COMPLETIONS), (body.find(b'"messages"'), CHAT)) if i >= 0]
    return min(found)[1] if found else None
CONTENT_TYPES = [None, "application/json", "text/plain", "application/x-www-form-urlencoded",
                 "multipart/form-data; boundary=x", "application/json; charset=latin-1"]


@st.composite
def raw_bodies(draw: st.DrawFn) -> Case:
    """Bodies that are not what the parser expects at the byte level."""
    path = draw(st.sampled_from([CHAT, COMPLETIONS, NATIVE]))
    choice = draw(st.integers(0, 2))
    if choice == 0:
        body, note = draw(st.binary(max_size=256)), "random bytes"
    elif choice == 1:
        inner = encode(draw(any_json))
        body, note = inner, "any JSON value"
    else:
        body, note = draw(st.sampled_from(RAW_BODIES))
        if path != NATIVE or b'"messages"' in body:  # a prompt body is llama-server's too
            path = raw_path(body) or path
    hdr = dict(draw(headers))
    ctype = draw(st.sampled_from(CONTENT_TYPES))
    hdr["Content-Type"] = ctype or ""  # "": no Content-Type header at all
    return Case(path, body, hdr, note)


SHORT_ANSWERS = ["Say OK.", "Name one color.", "What is 2+2?", "Reply with one word."]
"""Turns SmolLM2 answers greedily in 6 to 31 tokens and then ends. ("Hi" ran to the end of the context,
4,086 tokens: that is the context's bound, proven elsewhere, and it cost two minutes a run here.)"""


@st.composite
def big_limits(draw: st.DrawFn) -> Case:
    """A short chat turn with a huge (or merely large) generation limit and EOS honoured: the
    answer is a 400 or a bounded answer within the client timeout."""
    name = draw(st.sampled_from(["max_tokens", "max_completion_tokens", "n_predict"]))
    value = draw(st.one_of(st.sampled_from(HUGE_INTS + [1e308, 1e19, 4096.0, 100_000, 2048, 4096]),
                           st.integers(1000, 2**70)))
    body = {"messages": [{"role": "user", "content": draw(st.sampled_from(SHORT_ANSWERS))}],
            name: value, "temperature": 0, "ignore_eos": False, "stream": draw(st.booleans())}
    return Case(CHAT, encode(body), {}, f"{name}={value}")


# ----- the exchange and the invariant ------------------------------------------------------

class Violation(AssertionError):
    """A door broke its promise. Subclasses name the promise, so a test runner can tell bugs apart."""


class ServerError(Violation):
    """5xx other than 503 (or a server_error event in a stream)."""


class BadStatus(Violation):
    """A status that is neither 2xx, 4xx nor 503."""


class MalformedBody(Violation):
    """A 2xx that is not a well-formed OpenAI completion, or an error that is not OpenAI error JSON."""


class MalformedStream(Violation):
    """An SSE stream that is not well formed or does not end in ``data: [DONE]``."""


class Hang(Violation):
    """No complete answer within the client timeout."""


class Dropped(Violation):
    """The connection was closed or refused without a complete HTTP answer."""


class EngineDown(Violation):
    """An engine's /livez is not 200 afterwards (or its process exited)."""


class SlotBusy(Violation):
    """A slot still busy or a request still queued after the answer ended."""


class PhantomInflight(Violation):
    """The coordinator still counts a request in flight after the answer ended."""


class NotServedAfter(Violation):
    """A normal request after the example was not served."""


@dataclass
class Outcome:
    status: int | None
    seconds: float
    problems: list[Violation] = field(default_factory=list)
    kind: str = ""  # "json", "sse", "error" (HTTP error JSON), or the exception's class
    code: str | None = None  # an error answer's error.code


def _strict_json(data: bytes | str) -> Any:
    def no_constant(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(data, parse_constant=no_constant)


def _check_error_json(obj: Any, where: str) -> str | None:
    if not isinstance(obj, dict) or set(obj) != {"error"} or not isinstance(obj["error"], dict):
        return f"{where}: not OpenAI error JSON: {str(obj)[:300]}"
    err = obj["error"]
    missing = {"message", "type", "code", "param"} - set(err)
    if missing:
        return f"{where}: error JSON lacks {sorted(missing)}: {str(obj)[:300]}"
    if not isinstance(err["message"], str) or not err["message"] or not isinstance(err["type"], str):
        return f"{where}: error message/type are not non-empty strings: {str(obj)[:300]}"
    if not (err["code"] is None or isinstance(err["code"], (str, int))) or not (err["param"] is None or isinstance(err["param"], str)):
        return f"{where}: error code/param have wrong types: {str(obj)[:300]}"
    return None


def _check_usage(usage: Any) -> str | None:
    if not isinstance(usage, dict):
        return f"usage is not an object: {usage!r}"
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if not isinstance(usage.get(k), int) or usage[k] < 0:
            return f"usage.{k} is not a non-negative integer: {usage!r}"
    if usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
        return f"usage.total_tokens is not the sum: {usage!r}"
    return None


STOP_TYPES = ("eos", "limit", "word")


def _is_logprob(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and v <= 0


def _check_token_entries(entries: Any, where: str) -> str | None:
    """OpenAI chat's ``logprobs.content`` and llama-server's ``completion_probabilities``: per token
    ``{id, token, bytes, logprob, top_logprobs}``, the alternatives sorted, most likely first."""
    if not isinstance(entries, list):
        return f"{where} is not a list: {str(entries)[:300]}"
    for e in entries:
        alts = e.get("top_logprobs") if isinstance(e, dict) else None
        for item in ([e] + alts) if isinstance(alts, list) else [e]:
            if not (isinstance(item, dict) and type(item.get("id")) is int and isinstance(item.get("token"), str)
                    and isinstance(item.get("bytes"), list) and all(type(b) is int and 0 <= b < 256 for b in item["bytes"])
                    and _is_logprob(item.get("logprob"))):
                return f"{where} has a malformed token: {str(item)[:300]}"
        if not isinstance(alts, list):
            return f"{where} has a token without top_logprobs: {str(e)[:300]}"
        values = [a["logprob"] for a in alts]
        if values != sorted(values, reverse=True):
            return f"{where}: top_logprobs not sorted: {values}"
    return None


def _check_logprobs(lp: Any, chat: bool, where: str) -> str | None:
    """A choice's ``logprobs``: null, or the chat or legacy shape."""
    if lp is None:
        return None
    if chat:
        if not isinstance(lp, dict) or set(lp) != {"content"}:
            return f"{where}: chat logprobs is not {{content}}: {str(lp)[:300]}"
        return _check_token_entries(lp["content"], f"{where}.content")
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    if not isinstance(lp, dict) or set(lp) != set(keys) or not all(isinstance(lp[k], list) for k in keys):
        return f"{where}: legacy logprobs is not {{{', '.join(keys)}}}: {str(lp)[:300]}"
    if len({len(lp[k]) for k in keys}) != 1:
        return f"{where}: legacy logprobs lists differ in length: {str(lp)[:300]}"
    if not (all(isinstance(t, str) for t in lp["tokens"]) and all(_is_logprob(v) for v in lp["token_logprobs"])
            and all(isinstance(d, dict) and all(isinstance(k, str) and _is_logprob(v) for k, v in d.items())
                    for d in lp["top_logprobs"])
            and all(type(o) is int and o >= 0 for o in lp["text_offset"]) and lp["text_offset"] == sorted(lp["text_offset"])):
        return f"{where}: malformed legacy logprobs: {str(lp)[:300]}"
    return None


def _check_native(obj: Any) -> str | None:
    """llama-server's /completion answer, or the last event of its stream."""
    if not isinstance(obj, dict):
        return f"2xx body is not an object: {str(obj)[:300]}"
    for key, kind in (("content", str), ("tokens", list), ("stop_type", str), ("stopping_word", str),
                      ("tokens_predicted", int), ("tokens_evaluated", int), ("tokens_cached", int), ("model", str),
                      ("id_slot", int), ("timings", dict), ("generation_settings", dict), ("truncated", bool)):
        if not isinstance(obj.get(key), kind) or isinstance(obj.get(key), bool) != (kind is bool):
            return f"/completion answer lacks {key} ({kind.__name__}): {str(obj)[:300]}"
    if obj.get("stop") is not True or obj["stop_type"] not in STOP_TYPES:
        return f"/completion answer has stop={obj.get('stop')!r} stop_type={obj['stop_type']!r}"
    if not all(type(t) is int for t in obj["tokens"]):
        return f"/completion tokens are not token ids: {str(obj['tokens'])[:300]}"
    if "completion_probabilities" in obj:
        problem = _check_token_entries(obj["completion_probabilities"], "completion_probabilities")
        if problem:
            return problem
    if min(obj["tokens_predicted"], obj["tokens_evaluated"], obj["tokens_cached"]) < 0:
        return f"/completion counts are negative: {str(obj)[:300]}"
    return None


def _check_progress(p: Any, where: str) -> str | None:
    """llama-server's ``prompt_progress``: counts of the prompt's tokens, ``cache <= processed <= total``."""
    keys = ("total", "cache", "processed", "time_ms")
    if not (isinstance(p, dict) and set(p) == set(keys) and all(type(p[k]) is int and p[k] >= 0 for k in keys)
            and p["cache"] <= p["processed"] <= p["total"]):
        return f"{where} is not {{total, cache, processed, time_ms}} in order: {str(p)[:300]}"
    return None


def _check_native_stream(events: list[str]) -> Violation | None:
    """Data events of content pieces (``stop: false``), then one with ``stop: true`` or an error; no [DONE]."""
    for i, ev in enumerate(events):
        if ev.startswith(":"):
            continue
        if not ev.startswith("data: "):
            return MalformedStream(f"event {i} is not a data line: {ev[:200]!r}")
        try:
            obj = _strict_json(ev[len("data: "):])
        except ValueError as exc:
            return MalformedStream(f"event {i} is not JSON ({exc}): {ev[:200]!r}")
        last = i == len(events) - 1
        if isinstance(obj, dict) and "error" in obj:
            problem = _check_error_json(obj, f"stream event {i}")
            if problem:
                return MalformedStream(problem)
            if obj["error"].get("type") == "server_error":
                return ServerError(f"stream ended with a server error: {ev[:400]}")
            if not last:
                return MalformedStream(f"error event {i} is not the last of {len(events)}")
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("content"), str) or not isinstance(obj.get("tokens"), list):
            return MalformedStream(f"event {i} is not a /completion piece: {ev[:300]}")
        if not last and "prompt_progress" in obj:
            problem = _check_progress(obj["prompt_progress"], f"event {i} prompt_progress")
            if problem:
                return MalformedStream(problem)
        if not last and "completion_probabilities" in obj:
            problem = _check_token_entries(obj["completion_probabilities"], f"event {i} completion_probabilities")
            if problem:
                return MalformedStream(problem)
        if obj.get("stop") is not last:
            return MalformedStream(f"event {i} of {len(events)} has stop={obj.get('stop')!r}")
        if last:
            problem = _check_native(obj)
            return MalformedStream(problem) if problem else None
    return MalformedStream("stream ends without an event with stop: true or an error event")


def _check_vector(v: Any, where: str) -> str | None:
    if not (isinstance(v, list) and len(v) == N_EMBD and all(type(x) is float and math.isfinite(x) for x in v)):
        return f"{where} is not {N_EMBD} finite floats: {str(v)[:200]}"
    return None


def _check_embeddings(obj: Any, path: str) -> str | None:
    """OpenAI's list of embeddings (floats or base64 of float32), or llama-server's /embedding list."""
    if path == NATIVE_EMBEDDING:
        if not isinstance(obj, list) or not obj:
            return f"/embedding answer is not a non-empty list: {str(obj)[:300]}"
        for i, item in enumerate(obj):
            if not isinstance(item, dict) or item.get("index") != i or not isinstance(item.get("embedding"), list) \
                    or len(item["embedding"]) != 1:
                return f"/embedding item {i} is not {{index, embedding: [vector]}}: {str(item)[:300]}"
            problem = _check_vector(item["embedding"][0], f"/embedding item {i}")
            if problem:
                return problem
        return None
    if not isinstance(obj, dict) or obj.get("object") != "list" or not isinstance(obj.get("model"), str):
        return f"2xx body is not an embedding list: {str(obj)[:300]}"
    data, usage = obj.get("data"), obj.get("usage")
    if not isinstance(data, list) or not data:
        return f"2xx body has data={str(data)[:300]}"
    for i, item in enumerate(data):
        if not isinstance(item, dict) or item.get("index") != i or item.get("object") != "embedding":
            return f"data[{i}] is not an embedding: {str(item)[:300]}"
        v = item.get("embedding")
        if isinstance(v, str):
            try:
                raw = base64.b64decode(v, validate=True)
            except ValueError as exc:
                return f"data[{i}].embedding is not base64 ({exc})"
            v = list(struct.unpack(f"<{len(raw) // 4}f", raw)) if len(raw) % 4 == 0 else None
        problem = _check_vector(v, f"data[{i}].embedding")
        if problem:
            return problem
    if not (isinstance(usage, dict) and type(usage.get("prompt_tokens")) is int and usage["prompt_tokens"] >= len(data)
            and usage.get("total_tokens") == usage["prompt_tokens"]):
        return f"usage is not {{prompt_tokens, total_tokens}}: {usage!r}"
    return None


ANTHROPIC_STOPS = ("end_turn", "max_tokens", "stop_sequence", "tool_use")


def _check_anthropic_error(obj: Any, where: str) -> str | None:
    if not (isinstance(obj, dict) and set(obj) == {"type", "error"} and obj["type"] == "error"
            and isinstance(obj["error"], dict) and set(obj["error"]) == {"type", "message"}
            and isinstance(obj["error"]["type"], str) and isinstance(obj["error"]["message"], str)
            and obj["error"]["message"]):
        return f"{where}: not Anthropic error JSON: {str(obj)[:300]}"
    return None


def _check_block(b: Any, where: str) -> str | None:
    if isinstance(b, dict) and b.get("type") == "text" and set(b) == {"type", "text"} and isinstance(b["text"], str):
        return None
    if (isinstance(b, dict) and b.get("type") == "tool_use" and set(b) == {"type", "id", "name", "input"}
            and isinstance(b["id"], str) and b["id"].startswith("toolu_") and isinstance(b["name"], str) and b["name"]
            and isinstance(b["input"], dict)):
        return None
    return f"{where} is not a text or tool_use block: {str(b)[:300]}"


def _check_anthropic_usage(u: Any) -> str | None:
    keys = {"input_tokens", "output_tokens", "cache_read_input_tokens"}
    if not (isinstance(u, dict) and set(u) == keys and all(type(u[k]) is int and u[k] >= 0 for k in keys)):
        return f"usage is not Anthropic's: {u!r}"
    return None


def _check_message(obj: Any) -> str | None:
    """A Messages API answer: its blocks (text and tool_use), a stop_reason that says tool_use
    exactly when the answer calls, Anthropic's usage."""
    if not (isinstance(obj, dict) and obj.get("type") == "message" and obj.get("role") == "assistant"
            and isinstance(obj.get("id"), str) and obj["id"].startswith("msg_") and isinstance(obj.get("model"), str)):
        return f"2xx body is not a message: {str(obj)[:300]}"
    content = obj.get("content")
    if not isinstance(content, list) or not content:
        return f"message content is not a non-empty list: {str(content)[:300]}"
    problem = next((p for i, b in enumerate(content) if (p := _check_block(b, f"content[{i}]"))), None)
    if problem:
        return problem
    calls = any(b["type"] == "tool_use" for b in content)
    if obj.get("stop_reason") not in ANTHROPIC_STOPS or (obj["stop_reason"] == "tool_use") != calls:
        return f"stop_reason {obj.get('stop_reason')!r} for content {str(content)[:300]}"
    if (obj["stop_reason"] == "stop_sequence") != isinstance(obj.get("stop_sequence"), str):
        return f"stop_sequence {obj.get('stop_sequence')!r} with stop_reason {obj['stop_reason']!r}"
    return _check_anthropic_usage(obj.get("usage"))


def _check_anthropic_stream(text_: str) -> Violation | None:
    """Anthropic's events: message_start, blocks opened, filled and closed in order (each delta of
    its block's kind), then message_delta and message_stop; or an error event that ends it."""
    events = [e for e in text_.split("\n\n") if e.strip()]
    open_: str | None = None
    n_blocks, stop = 0, None
    for i, ev in enumerate(events):
        lines = ev.split("\n")
        if len(lines) != 2 or not lines[0].startswith("event: ") or not lines[1].startswith("data: "):
            return MalformedStream(f"event {i} is not an event and a data line: {ev[:200]!r}")
        try:
            obj = _strict_json(lines[1][len("data: "):])
        except ValueError as exc:
            return MalformedStream(f"event {i} is not JSON ({exc}): {ev[:200]!r}")
        name = lines[0][len("event: "):]
        if not isinstance(obj, dict) or obj.get("type") != name:
            return MalformedStream(f"event {i} data does not say {name!r}: {ev[:200]!r}")
        if (i == 0) != (name == "message_start"):
            return MalformedStream(f"event {i} is {name}")
        if name == "error":
            problem = _check_anthropic_error(obj, f"stream event {i}")
            if problem:
                return MalformedStream(problem)
            if obj["error"]["type"] == "api_error":
                return ServerError(f"stream ended with a server error: {ev[:400]}")
            return None if i == len(events) - 1 else MalformedStream(f"events after the error event {i}")
        if name == "content_block_start":
            block = obj.get("content_block")
            if open_ is not None or obj.get("index") != n_blocks or _check_block(
                    {**block, "input": {}} if isinstance(block, dict) and block.get("type") == "tool_use" else block, ""):
                return MalformedStream(f"event {i}: a block opened out of order or malformed: {ev[:300]!r}")
            open_, n_blocks = block["type"], n_blocks + 1
        elif name == "content_block_delta":
            delta = obj.get("delta") if isinstance(obj.get("delta"), dict) else {}
            want = {"text": ("text_delta", "text"), "tool_use": ("input_json_delta", "partial_json")}.get(open_ or "")
            if want is None or obj.get("index") != n_blocks - 1 or delta.get("type") != want[0] \
                    or not isinstance(delta.get(want[1]), str):
                return MalformedStream(f"event {i}: a delta outside its block: {ev[:300]!r}")
        elif name == "content_block_stop":
            if open_ is None or obj.get("index") != n_blocks - 1:
                return MalformedStream(f"event {i}: a block closed that is not open: {ev[:300]!r}")
            open_ = None
        elif name == "message_delta":
            stop = (obj.get("delta") or {}).get("stop_reason")
            if open_ is not None or stop not in ANTHROPIC_STOPS or _check_anthropic_usage(obj.get("usage")):
                return MalformedStream(f"event {i}: a bad message_delta: {ev[:300]!r}")
        elif name == "message_stop":
            if stop is None or i != len(events) - 1 or not n_blocks:
                return MalformedStream(f"event {i}: message_stop without message_delta or blocks, or not last")
        elif name not in ("message_start", "ping"):
            return MalformedStream(f"event {i} is an unknown {name!r}")
    if not events or events[-1].split("\n")[0] != "event: message_stop":
        return MalformedStream(f"stream ends without message_stop or an error: ...{text_[-300:]!r}")
    return None


def _check_completion(obj: Any, path: str) -> str | None:
    if path == MESSAGES:
        return _check_message(obj)
    if path in (NATIVE, INFILL):
        return _check_native(obj)
    if path in (EMBEDDINGS, NATIVE_EMBEDDING):
        return _check_embeddings(obj, path)
    chat = path == CHAT
    if not isinstance(obj, dict):
        return f"2xx body is not an object: {str(obj)[:300]}"
    if obj.get("object") != ("chat.completion" if chat else "text_completion"):
        return f"2xx body has object={obj.get('object')!r}"
    if not isinstance(obj.get("id"), str) or not isinstance(obj.get("created"), int) or not isinstance(obj.get("model"), str):
        return f"2xx body lacks id/created/model: {str(obj)[:300]}"
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return f"2xx body has choices={str(choices)[:300]}"
    c = choices[0]
    if c.get("index") != 0 or c.get("finish_reason") not in ("stop", "length", *(("tool_calls",) if chat else ())):
        return f"choice has index={c.get('index')!r} finish_reason={c.get('finish_reason')!r}"
    if chat:
        msg = c.get("message")
        calls = msg.get("tool_calls") if isinstance(msg, dict) else None
        if calls is not None:  # an answer that called tools: content may be null
            problem = _check_tool_calls(calls, "choice.message.tool_calls", whole=True)
            if problem or (c["finish_reason"] == "tool_calls") != bool(calls):
                return problem or f"tool_calls with finish_reason={c['finish_reason']!r}"
        elif c.get("finish_reason") == "tool_calls":
            return "finish_reason tool_calls without message.tool_calls"
        if not isinstance(msg, dict) or msg.get("role") != "assistant" or not (
                isinstance(msg.get("content"), str) or (calls and msg.get("content") is None)):
            return f"choice.message is not an assistant message: {str(msg)[:300]}"
    elif not isinstance(c.get("text"), str):
        return f"choice.text is not a string: {str(c)[:300]}"
    return _check_logprobs(c.get("logprobs"), chat, "choice.logprobs") or _check_usage(obj.get("usage"))


def _check_tool_calls(calls: Any, where: str, whole: bool) -> str | None:
    """OpenAI's calls: each with its index (in a stream) or id, type and function name (a whole
    answer, or a stream entry that opens a call), and arguments as text."""
    if not isinstance(calls, list) or not calls:
        return f"{where} is not a non-empty list: {str(calls)[:300]}"
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("arguments", ""), str):
            return f"{where}: a call without function arguments text: {str(call)[:300]}"
        opens = whole or "id" in call
        if opens and (not isinstance(call.get("id"), str) or call.get("type") != "function"
                      or not isinstance(fn.get("name"), str) or not fn["name"]):
            return f"{where}: a call without id, type or name: {str(call)[:300]}"
        if whole and not isinstance(fn.get("arguments"), str):
            return f"{where}: a call without arguments: {str(call)[:300]}"
        if not whole and not isinstance(call.get("index"), int):
            return f"{where}: a streamed call without index: {str(call)[:300]}"
    return None


def _check_stream(data: bytes, path: str) -> Violation | None:
    try:
        text_ = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return MalformedStream(f"stream is not UTF-8: {exc}")
    if path in (NATIVE, INFILL):
        return _check_native_stream([e for e in text_.split("\n\n") if e.strip()])
    if path == MESSAGES:
        return _check_anthropic_stream(text_)
    if not text_.endswith("data: [DONE]\n\n"):
        return MalformedStream(f"stream does not end with 'data: [DONE]': ...{text_[-300:]!r}")
    events = [e for e in text_.split("\n\n") if e.strip()]
    want = "chat.completion.chunk" if path == CHAT else "text_completion"
    finished = False
    for i, ev in enumerate(events):
        if not ev.startswith("data: "):
            if ev.startswith(":"):  # an SSE comment (keep-alive)
                continue
            return MalformedStream(f"event {i} is not a data line: {ev[:200]!r}")
        payload = ev[len("data: "):]
        if payload == "[DONE]":
            if i != len(events) - 1:
                return MalformedStream(f"[DONE] is event {i} of {len(events)}")
            continue
        try:
            obj = _strict_json(payload)
        except ValueError as exc:
            return MalformedStream(f"event {i} is not JSON ({exc}): {payload[:200]!r}")
        if isinstance(obj, dict) and "error" in obj:
            problem = _check_error_json(obj, f"stream event {i}")
            if problem:
                return MalformedStream(problem)
            if obj["error"].get("type") == "server_error":
                return ServerError(f"stream ended with a server error: {payload[:400]}")
            finished = True
            continue
        if not isinstance(obj, dict) or obj.get("object") != want or not isinstance(obj.get("choices"), list):
            return MalformedStream(f"event {i} is not a {want}: {payload[:300]}")
        if obj["choices"] == []:
            problem = _check_usage(obj.get("usage"))
            if problem:
                return MalformedStream(f"usage chunk: {problem}")
            continue
        c = obj["choices"][0]
        if not isinstance(c, dict) or (c.get("finish_reason") not in (None, "stop", "length",
                                                                      *(("tool_calls",) if path == CHAT else ()))):
            return MalformedStream(f"event {i} has a bad choice: {payload[:300]}")
        calls = c.get("delta", {}).get("tool_calls") if path == CHAT and isinstance(c.get("delta"), dict) else None
        problem = None if calls is None else _check_tool_calls(calls, f"event {i} delta.tool_calls", whole=False)
        if problem:
            return MalformedStream(problem)
        problem = _check_logprobs(c.get("logprobs"), path == CHAT, f"event {i} logprobs")
        if problem:
            return MalformedStream(problem)
        if c.get("finish_reason") is not None:
            finished = True
    if not finished:
        return MalformedStream("stream ends without a finish_reason or an error event")
    return None


def exchange(client: httpx.Client, base_url: str, case: Case, timeout: float = CLIENT_TIMEOUT) -> Outcome:
    """Send one case and check the answer itself (status, body or stream), within ``timeout`` in all."""
    t0 = time.monotonic()
    # header values as latin-1 bytes: X-Session-Id may carry any octet an HTTP client can send
    hdr: dict[str, bytes] = {k: v.encode("latin-1") for k, v in {"Content-Type": "application/json", **case.headers}.items() if v or k != "Content-Type"}
    try:
        with client.stream("POST", base_url + case.path, content=case.body, headers=hdr,
                           timeout=httpx.Timeout(timeout, connect=5.0)) as r:
            chunks: list[bytes] = []
            size = 0
            for piece in r.iter_raw():
                chunks.append(piece)
                size += len(piece)
                if time.monotonic() - t0 > timeout:
                    return Outcome(r.status_code, time.monotonic() - t0,
                                   [Hang(f"answer {r.status_code} still streaming after {timeout:g} s")], "hang")
                if size > 64 << 20:
                    return Outcome(r.status_code, time.monotonic() - t0,
                                   [MalformedBody(f"answer larger than 64 MiB (status {r.status_code})")], "huge")
            data = b"".join(chunks)
            status, ctype = r.status_code, r.headers.get("content-type", "")
    except httpx.LocalProtocolError:
        raise  # the client refused to send this: a mistake of the strategy, not of the door
    except httpx.TimeoutException as exc:
        return Outcome(None, time.monotonic() - t0, [Hang(f"no answer within {timeout:g} s ({type(exc).__name__})")], "hang")
    except httpx.TransportError as exc:
        return Outcome(None, time.monotonic() - t0, [Dropped(f"{type(exc).__name__}: {exc}")], type(exc).__name__)
    out = Outcome(status, time.monotonic() - t0)
    if 200 <= status < 300:
        if ctype.startswith("text/event-stream"):
            out.kind = "sse"
            problem = _check_stream(data, case.path)
            if problem:
                out.problems.append(problem)
        else:
            out.kind = "json"
            try:
                problem = _check_completion(_strict_json(data), case.path)
            except ValueError as exc:
                problem = f"2xx body is not JSON ({exc}): {data[:300]!r}"
            if problem:
                out.problems.append(MalformedBody(problem))
        return out
    out.kind = "error"
    unsupported = status == 501 and case.path == INFILL  # llama-server's answer for a model without FIM tokens
    if status >= 500 and status != 503 and not unsupported:
        out.problems.append(ServerError(f"status {status}: {data[:500].decode('utf-8', 'replace')}"))
        return out
    if not (400 <= status < 500 or status == 503 or unsupported):
        out.problems.append(BadStatus(f"status {status}: {data[:300]!r}"))
        return out
    try:
        obj = _strict_json(data)
        if case.path == MESSAGES:
            problem = _check_anthropic_error(obj, f"status {status}")
            if problem is None:
                out.code = obj["error"]["type"]
        else:
            problem = _check_error_json(obj, f"status {status}")
            if problem is None:
                out.code = str(obj["error"]["code"])
    except ValueError as exc:
        problem = f"status {status} body is not JSON ({exc}): {data[:300]!r}"
    if problem:
        out.problems.append(MalformedBody(problem))
    return out


NORMAL = Case(CHAT, encode({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}), {}, "normal request")


def _get(client: httpx.Client, url: str) -> httpx.Response | None:
    try:
        return client.get(url, timeout=5.0)
    except httpx.HTTPError:
        return None


def settle(client: httpx.Client, engine_urls: Iterable[str], admin_url: str | None,
           alive: Callable[[], list[str]] = lambda: [], settle_s: float = SETTLE_S) -> list[Violation]:
    """After an answer ended: engines alive, every slot free, nothing queued, nothing in flight at
    the coordinator (polled for ``settle_s``). ``alive`` names processes that exited."""
    deadline = time.monotonic() + settle_s
    while True:
        problems: list[Violation] = [EngineDown(m) for m in alive()]
        for url in engine_urls:
            r = _get(client, url + "/livez")
            if r is None or r.status_code != 200:
                problems.append(EngineDown(f"{url}/livez answers {r.status_code if r is not None else 'nothing'}"
                                           f"{': ' + r.text[:200] if r is not None else ''}"))
                continue
            r = _get(client, url + "/slots")
            busy = [s["id"] for s in (r.json() if r is not None and r.status_code == 200 else []) if s.get("is_processing")]
            h = _get(client, url + "/health")
            view = (h.json().get("slots") or {}) if h is not None else {}
            if busy or view.get("queued") or view.get("busy"):
                problems.append(SlotBusy(f"{url}: slots busy {busy}, /health slots {view}, {settle_s:g} s after the answer"))
        if admin_url is not None:
            r = _get(client, admin_url + "/admin/engines")
            if r is None or r.status_code != 200:
                problems.append(EngineDown(f"coordinator {admin_url}/admin/engines answers "
                                           f"{r.status_code if r is not None else 'nothing'}"))
            else:
                phantom = {e["name"]: e.get("inflight") for e in r.json()["engines"] if e.get("inflight")}
                dead = [e["name"] for e in r.json()["engines"] if not e.get("alive")]
                if phantom:
                    problems.append(PhantomInflight(f"coordinator counts in-flight requests {phantom} "
                                                    f"{settle_s:g} s after the answer"))
                if dead:
                    problems.append(EngineDown(f"coordinator sees engines {dead} dead"))
        if not problems or time.monotonic() > deadline or any(isinstance(p, EngineDown) for p in problems):
            return problems
        time.sleep(0.05)


def follow_up(client: httpx.Client, base_url: str) -> list[Violation]:
    """A normal request is served (200) after the example."""
    out = exchange(client, base_url, NORMAL)
    if out.status != 200 or out.problems:
        return [NotServedAfter(f"a normal request then got {out.status} ({out.kind}): "
                               + "; ".join(f"{type(p).__name__}: {p}" for p in out.problems))]
    return []
