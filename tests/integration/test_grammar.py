"""Constrained output on a real engine (SmolLM2) and through the coordinator's front door:
``grammar`` (GBNF), ``json_schema`` and OpenAI's JSON ``response_format`` really constrain every
token; bad, hostile and oversized grammars and schemas are a 400 naming the field, never a 500,
and the engine serves on."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests.support.coordinator import Coordinator
from tests.support.engine import Engine

pytestmark = pytest.mark.model

YES_NO = 'root ::= "yes" | "no"'
CSV = 'root ::= [0-9]{1,4} ("," [0-9]{1,4})*'
CSV_PREFIX = re.compile(r"([0-9]{1,4}(,[0-9]{1,4})*,?)?")
SCHEMA = {"type": "object", "properties": {"count": {"type": "integer"}, "name": {"type": "string"}},
          "required": ["count"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Is the sky blue? Answer yes or no, then explain at length."}]
ASK_JSON = [{"role": "user", "content": "Describe a cat in JSON."}]

# (request fields, the field the 400 must name)
REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"grammar": "root ::= undefined-rule"}, "grammar"),
    ({"grammar": 'root ::= "unterminated'}, "grammar"),
    ({"grammar": 'rule ::= "no root"'}, "grammar"),
    ({"grammar": 'root ::= "a"{5,2}'}, "grammar"),
    ({"grammar": 'root ::= "a"{100000}'}, "grammar"),
    ({"grammar": "root ::= " + "(" * 30000 + '"a"' + ")" * 30000}, "grammar"),
    ({"grammar": 'root ::= "' + "x" * 70000 + '"'}, "grammar"),
    ({"grammar": 'root ::= "' + "x" * 60000 + '"{1999}'}, "grammar"),
    ({"grammar": 'root ::= "a\\x00"\x00'}, "grammar"),
    ({"grammar": "root ::= r0\n" + "".join(f'r{i} ::= r{i + 1} "a" | r{i + 1} "b"\n' for i in range(24)) + 'r24 ::= "x"'},
     "grammar"),
    ({"grammar": 'root ::= root "a" | "b"'}, "grammar"),
    ({"grammar": 7}, "grammar"),
    ({"json_schema": {"type": "no-such-type"}}, "json_schema"),
    ({"json_schema": {"$ref": "#/definitions/missing"}}, "json_schema"),
    ({"json_schema": "object"}, "json_schema"),
    ({"json_schema": {"type": "object", "description": "d" * 70000}}, "json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"grammar": YES_NO, "json_schema": SCHEMA}, "json_schema"),
    ({"grammar": YES_NO, "response_format": {"type": "json_object"}}, "response_format"),
]

# Schemas that break JSON Schema's own rules: each a 400 naming the field and the schema's keyword
# (some were accepted and ignored, others refused with the converter's exception and no place)
INVALID_SCHEMAS: list[tuple[dict[str, Any], str, str]] = [
    ({"json_schema": {"type": 5}}, "json_schema", "/type: a number is not a type"),
    ({"json_schema": {"properties": []}}, "json_schema", "/properties: must be an object mapping names to schemas"),
    ({"json_schema": {"anyOf": {}}}, "json_schema", "/anyOf: must be a non-empty array of schemas"),
    ({"json_schema": {"type": "array", "minItems": -1}}, "json_schema", "/minItems: must be a non-negative integer"),
    ({"json_schema": {"type": "object", "properties": {"age": {"type": "integr"}}}}, "json_schema",
     "/properties/age/type: 'integr' is not a type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object",
                                                                            "additionalProperties": 5}}}},
     "response_format", "/additionalProperties: must be a schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "x"}}}]},
     "tools[0].function.parameters", "/required: must be an array of property names"),
]

# GBNF that passes the doors' checker but that only llama.cpp, with the model's vocabulary, can
# refuse: the engine answers 400 as well.
REFUSED_BY_LLAMA = ["root ::= <no-such-single-token>"]

# Grammars no token can begin (a character class with nothing in it): refused when the first token
# is sampled, not answered with empty text.
UNSATISFIABLE = ["root ::= [b-a]", 'root ::= [^\\x00-\\U0010FFFF] "x"']

# Ambiguity that grows with the text (each "a" doubles llama.cpp's stacks while the closing letters
# are pending) cannot be bounded before it runs: the request ends with a 400 once a token's grammar
# work passes the engine's limit, long before it could stall the engine.
GROWING = 'root ::= r\nr ::= "a" r "b" | "a" r "c" | "a" tail\ntail ::= "a"{30} "z"'



def _chat(http: httpx.Client, messages: list[dict[str, str]], **fields: Any) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 48, **fields}, timeout=120)


def _content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def _stream_pieces(http: httpx.Client, body: dict[str, Any]) -> tuple[list[str], str | None]:
    pieces: list[str] = []
    finish = None
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            pieces.append(choice["text"])
            finish = choice["finish_reason"] or finish
    return pieces, finish


def _assert_constrained(http: httpx.Client) -> None:
    """The checks both doors must pass: each constraint holds on the whole answer (and on every
    streamed prefix), greedy and sampled."""
    for fields in ({}, {"temperature": 1.0, "seed": 7}, {"temperature": 1.5, "top_k": 0, "seed": 11}):
        assert _content(_chat(http, ASK, grammar=YES_NO, **fields)) in ("yes", "no")
    pieces, finish = _stream_pieces(http, {"prompt": "Numbers: ", "grammar": CSV, "max_tokens": 24,
                                           "temperature": 1.0, "seed": 3})
    text = ""
    for piece in pieces:
        text += piece
        assert CSV_PREFIX.fullmatch(text), text
    assert text and finish in ("stop", "length")
    obj = json.loads(_content(_chat(http, ASK_JSON, response_format={"type": "json_object"}, max_tokens=200)))
    assert isinstance(obj, dict)
    for fields in ({"json_schema": SCHEMA},
                   {"response_format": {"type": "json_schema", "json_schema": {"name": "cat", "schema": SCHEMA}}}):
        obj = json.loads(_content(_chat(http, ASK_JSON, max_tokens=200, **fields)))
        assert isinstance(obj, dict) and isinstance(obj["count"], int) and set(obj) <= {"count", "name"}, obj


TREE = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                         "children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
        "required": ["name", "children"]}


def _assert_recursive_schema(http: httpx.Client) -> None:
    """A schema that refers to itself (llama.cpp supports it) constrains the answer: what is written
    before max_tokens cuts it is a prefix of a tree of names."""
    text = _content(_chat(http, ASK_JSON, json_schema=TREE, max_tokens=24))
    assert text.startswith('{"name"') or text.startswith('{ "name"'), text


def _assert_refusals(http: httpx.Client) -> None:
    for fields, name in REFUSED:
        r = _chat(http, ASK, **fields)
        assert r.status_code == 400, (fields.keys(), r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_field" and err["param"] == name and name in err["message"], err
    for fields, name, problem in INVALID_SCHEMAS:
        r = _chat(http, ASK, **fields)
        assert r.status_code == 400, (fields, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_field" and err["param"] == name and problem in err["message"], err
    for grammar in REFUSED_BY_LLAMA:
        r = _chat(http, ASK, grammar=grammar)
        assert r.status_code == 400 and "grammar" in r.json()["error"]["message"], r.text
    for grammar in UNSATISFIABLE:  # an empty 200 would look like an answer
        for stream in (False, True):
            r = _chat(http, ASK, grammar=grammar, stream=stream)
            assert r.status_code == 400 and r.json()["error"]["code"] == "grammar_unsatisfiable", r.text


def test_grammar_constrains_and_bad_grammars_are_refused(smollm_engine: Engine) -> None:
    http = smollm_engine.http
    _assert_constrained(http)
    _assert_recursive_schema(http)
    completion = http.post("/v1/completions", json={"prompt": "Q: Is fire hot? A:", "grammar": YES_NO,
                                                     "max_tokens": 8}, timeout=120)
    assert completion.status_code == 200 and completion.json()["choices"][0]["text"] in ("yes", "no")
    # ignore_eos bans the end of generation; a complete grammar then admits nothing: it ends, cleanly
    done = _chat(http, ASK, grammar=YES_NO, ignore_eos=True, max_tokens=16)
    assert _content(done) in ("yes", "no") and done.json()["choices"][0]["finish_reason"] == "stop"
    _assert_refusals(http)
    slow = http.post("/v1/completions", json={"prompt": "aaaa", "grammar": GROWING, "max_tokens": 40}, timeout=300)
    assert slow.status_code == 400 and slow.json()["error"]["code"] == "grammar_too_slow", slow.text
    # neutral values ask for nothing; an unconstrained request is unchanged
    free = _content(_chat(http, ASK, grammar="", json_schema={}, response_format={"type": "text"}))
    assert free and free not in ("yes", "no")
    assert http.get("/livez").status_code == 200
    smollm_engine.assert_running()




def test_grammar_through_the_front_door(solo_pool: tuple[Coordinator, Engine]) -> None:
    c, e = solo_pool
    _assert_constrained(c.http)
    _assert_recursive_schema(c.http)
    _assert_refusals(c.http)
    assert _content(_chat(c.http, ASK, max_tokens=8))  # the pool serves on
    c.assert_running()
    e.assert_running()
