"""OpenAI wire format: request parsing into GenRequest, refusals, error JSON, SSE chunks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hydrad.wire.grammar import MAX_GRAMMAR_CHARS, MAX_SCHEMA_CHARS, GrammarError, check_gbnf
from hydrad.wire.requests import GenRequest, SamplingOverrides
from hydrad.wire.openai import ApiError, ChatRequest, CompletionRequest, parse
from hydrad.wire.render.base import sse
from hydrad.wire.render.openai import DONE, chunk, full_response, new_id, usage_chunk

USER = [{"role": "user", "content": "Hello"}]


def body(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def chat(**kw: Any) -> tuple[Any, GenRequest]:
    kw.setdefault("messages", USER)
    return parse("chat", body(kw))


def completion(**kw: Any) -> tuple[Any, GenRequest]:
    kw.setdefault("prompt", "Once upon a time")
    return parse("completion", body(kw))


def refused(kind: str, raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as ei:
        parse(kind, raw)  # type: ignore[arg-type]
    assert ei.value.status == 400
    return ei.value


def chat_refused(**kw: Any) -> ApiError:
    kw.setdefault("messages", USER)
    return refused("chat", body(kw))


def completion_refused(**kw: Any) -> ApiError:
    kw.setdefault("prompt", "x")
    return refused("completion", body(kw))


# --------------------------------------------------------------------------- valid requests


def test_minimal_chat() -> None:
    req, gen = chat()
    assert isinstance(req, ChatRequest)
    assert isinstance(gen, GenRequest)
    assert gen.messages == USER and gen.prompt is None
    assert gen.max_tokens is None and gen.stop == []
    assert gen.sampling == SamplingOverrides()
    assert req.stream is False and req.include_usage() is False


def test_full_chat() -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi", "name": "bob"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again"},
    ]
    req, gen = chat(model="smollm2-135m", messages=msgs, max_tokens=32, temperature=0.0, top_p=0.9, top_k=10,
                    min_p=0.1, repeat_penalty=1.1, frequency_penalty=0.5, presence_penalty=-0.5, seed=7,
                    stop=["\n\n", "END"], stream=True, stream_options={"include_usage": True}, user="u1")
    assert req.model == "smollm2-135m" and req.stream is True and req.include_usage() is True
    assert gen.messages == [{"role": m["role"], "content": m["content"]} for m in msgs]
    assert gen.max_tokens == 32
    assert gen.stop == ["\n\n", "END"]
    assert gen.sampling == SamplingOverrides(temperature=0.0, top_k=10, top_p=0.9, min_p=0.1, repeat_penalty=1.1,
                                             frequency_penalty=0.5, presence_penalty=-0.5, seed=7)


def test_developer_role_maps_to_system() -> None:
    _, gen = chat(messages=[{"role": "developer", "content": "rules"}, {"role": "user", "content": "q"}])
    assert gen.messages == [{"role": "system", "content": "rules"}, {"role": "user", "content": "q"}]


def test_tool_role_passes() -> None:
    _, gen = chat(messages=[{"role": "tool", "content": "42"}])
    assert gen.messages == [{"role": "tool", "content": "42"}]


def test_null_or_missing_content_is_empty() -> None:
    _, gen = chat(messages=[{"role": "user", "content": None}, {"role": "assistant"}])
    assert gen.messages == [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]


def test_content_text_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}, {"type": "text", "text": "!"}]
    _, gen = chat(messages=[{"role": "user", "content": parts}])
    assert gen.messages == [{"role": "user", "content": "Hello, world!"}]


def test_empty_parts_list_is_empty_text() -> None:
    _, gen = chat(messages=[{"role": "user", "content": []}])
    assert gen.messages == [{"role": "user", "content": ""}]


def test_max_completion_tokens() -> None:
    assert chat(max_completion_tokens=12)[1].max_tokens == 12
    assert chat(max_completion_tokens=0)[1].max_tokens == 0


def test_max_tokens_wins_over_max_completion_tokens_and_n_predict() -> None:
    assert chat(max_tokens=5, max_completion_tokens=9, n_predict=11)[1].max_tokens == 5
    assert chat(max_completion_tokens=9, n_predict=11)[1].max_tokens == 9


def test_ignore_eos() -> None:
    assert chat()[1].ignore_eos is False
    assert chat(ignore_eos=True)[1].ignore_eos is True
    assert completion(ignore_eos=True)[1].ignore_eos is True
    assert completion(ignore_eos=False)[1].ignore_eos is False


def test_cache_prompt_reaches_the_engine() -> None:
    """llama-server's ``cache_prompt`` on the OpenAI doors: unset leaves the engine's default."""
    assert chat()[1].cache_prompt is None and completion()[1].cache_prompt is None
    assert chat(cache_prompt=True)[1].cache_prompt is True
    assert completion(cache_prompt=False)[1].cache_prompt is False
    assert completion(cache_prompt=True)[1].cache_prompt is True


def test_n_predict_as_limit() -> None:
    assert completion(n_predict=20)[1].max_tokens == 20
    assert completion(n_predict=-1)[1].max_tokens is None


def test_stop_as_string() -> None:
    assert chat(stop="###")[1].stop == ["###"]


def test_stop_as_list_drops_empty() -> None:
    assert chat(stop=["a", "", "b"])[1].stop == ["a", "b"]
    assert chat(stop=[])[1].stop == []
    assert chat(stop=None)[1].stop == []


def test_four_stops_allowed_five_refused() -> None:
    assert chat(stop=["1", "2", "3", "4"])[1].stop == ["1", "2", "3", "4"]
    assert chat(stop=["1", "2", "3", "4", "", ""])[1].stop == ["1", "2", "3", "4"]
    err = chat_refused(stop=["1", "2", "3", "4", "5"])
    assert err.param == "stop" and "stop" in err.message and "4" in err.message


def test_minimal_completion() -> None:
    req, gen = completion(prompt="Say hi", max_tokens=3, temperature=1.5, stop="\n")
    assert isinstance(req, CompletionRequest)
    assert gen.prompt == "Say hi" and gen.messages is None
    assert gen.max_tokens == 3 and gen.stop == ["\n"]
    assert gen.sampling.temperature == 1.5


def test_prompt_list_of_one() -> None:
    assert completion(prompt=["only one"])[1].prompt == "only one"


@pytest.mark.parametrize("prompts", [["a", "b"], []])
def test_prompt_list_of_other_length_refused(prompts: list[str]) -> None:
    err = completion_refused(prompt=prompts)
    assert err.param == "prompt" and "prompt" in err.message


def test_neutral_values_of_unsupported_fields_pass() -> None:
    chat(n=1, logprobs=False, top_logprobs=0, tools=[], tool_choice="none", logit_bias={}, best_of=1,
         echo=False, suffix="", parallel_tool_calls=None, modalities=["text"],
         response_format={"type": "text"}, add_generation_prompt=True, continue_final_message=False)
    completion(logprobs=None, echo=False, best_of=1, suffix="")


def test_unknown_extra_fields_are_ignored() -> None:
    req, _ = chat(some_vendor_field={"x": 1}, metadata={"a": "b"})
    assert (req.model_extra or {})["some_vendor_field"] == {"x": 1}


def test_include_usage_false_by_default() -> None:
    assert chat(stream=True)[0].include_usage() is False
    assert chat(stream=True, stream_options={"include_usage": False})[0].include_usage() is False


# --------------------------------------------------------------------------- refusals


def test_remote_image_url_refused() -> None:
    parts = [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    err = chat_refused(messages=[{"role": "user", "content": parts}])
    assert err.code == "invalid_image" and "remote image URLs are not fetched" in err.message
    assert err.param == "messages[0].content[1].image_url.url"


@pytest.mark.parametrize("part", ["plain string", {"type": "text"}, {"type": "text", "text": 5}, {"text": "x"}])
def test_malformed_parts_refused(part: Any) -> None:
    err = chat_refused(messages=[{"role": "user", "content": [part]}])
    assert "messages[0].content[0]" in err.message


@pytest.mark.parametrize("content", [5, {"type": "text", "text": "x"}, True])
def test_content_of_wrong_type_refused(content: Any) -> None:
    err = chat_refused(messages=[{"role": "user", "content": "ok"}, {"role": "user", "content": content}])
    assert err.param == "messages[1]" and "messages[1].content" in err.message


def test_n_is_bounded_and_only_where_several_choices_are_answered() -> None:
    assert chat(n=16)[1] is not None
    for n in (0, 17):
        assert chat_refused(n=n).param == "n"
    from hydrad.wire import native_completion
    with pytest.raises(ApiError) as err:
        native_completion.parse(json.dumps({"prompt": "x", "n": 2}).encode())
    assert err.value.param == "n" and err.value.code == "unsupported_field"


@pytest.mark.parametrize(("field", "value"), [
    ("functions", [{"name": "f"}]), ("function_call", "auto"),
    ("best_of", 2), ("echo", True), ("suffix", "end"),
    ("audio", {"voice": "x"}), ("modalities", ["text", "audio"]),
    ("prediction", {"type": "content", "content": "x"}),
    ("add_generation_prompt", False), ("continue_final_message", True),
])
def test_unsupported_field_refused(field: str, value: Any) -> None:
    err = chat_refused(**{field: value})
    assert err.code == "unsupported_field"
    assert err.param == field and field in err.message


@pytest.mark.parametrize(("field", "value"), [
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "required"),
    ("parallel_tool_calls", "yes"),
])
def test_tool_fields_refused_by_completions(field: str, value: Any) -> None:
    """Tools are a chat feature: the legacy completions door refuses them by name."""
    err = completion_refused(**{field: value})
    assert err.code == "unsupported_field" and err.param == field


def test_several_unsupported_fields_listed_n_first() -> None:
    err = completion_refused(echo=True, best_of=2, tools=[{}])
    assert err.param == "best_of"
    assert "best_of, echo, tools" in err.message or "echo, best_of, tools" in err.message


@pytest.mark.parametrize("rf", ["json", {"type": "xml"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": 1},
                                {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}},
                                {"type": "json_object", "schema": []}, {}])
def test_bad_response_format_refused(rf: Any) -> None:
    err = chat_refused(response_format=rf)
    assert err.code == "invalid_field" and err.param == "response_format" and "response_format" in err.message


# --------------------------------------------------------------------------- constrained output

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.mark.parametrize("fields", [
    {"grammar": 'root ::= "yes" | "no"'}, {"json_schema": SCHEMA}, {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_object", "schema": SCHEMA}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "any"}}},
])
def test_constraints_become_one_grammar(fields: dict[str, Any]) -> None:
    for parse_one in (chat, completion):
        grammar = parse_one(**fields)[1].sampling.grammar
        assert grammar is not None and "root ::=" in grammar
        check_gbnf(grammar)
    if "grammar" in fields:
        assert chat(**fields)[1].sampling.grammar == fields["grammar"]


def test_neutral_constraints_ask_for_nothing() -> None:
    assert chat(grammar="", json_schema={}, response_format={"type": "text"})[1].sampling.grammar is None
    assert chat(grammar=None, json_schema=None, response_format=None)[1].sampling.grammar is None
    assert chat()[1].sampling.grammar is None


@pytest.mark.parametrize("fields, field", [
    ({"grammar": "root ::= nowhere"}, "grammar"), ({"grammar": 'root ::= "open'}, "grammar"),
    ({"grammar": 'x ::= "no root"'}, "grammar"), ({"grammar": ["root ::= \"a\""]}, "grammar"),
    ({"grammar": 'root ::= "a"{2001}'}, "grammar"), ({"grammar": 'root ::= "a"{3,1}'}, "grammar"),
    ({"grammar": "root ::= " + "(" * 1000 + '"a"' + ")" * 1000}, "grammar"),
    ({"grammar": 'root ::= "' + "a" * (MAX_GRAMMAR_CHARS + 1) + '"'}, "grammar"),
    ({"json_schema": {"type": "unknown"}}, "json_schema"), ({"json_schema": [1, 2]}, "json_schema"),
    ({"json_schema": {"type": "string", "description": "x" * MAX_SCHEMA_CHARS}}, "json_schema"),
    ({"grammar": 'root ::= "a"', "json_schema": SCHEMA}, "json_schema"),
    ({"json_schema": SCHEMA, "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_constraints_refused_by_name(fields: dict[str, Any], field: str) -> None:
    for refuse in (chat_refused, completion_refused):
        err = refuse(**fields)
        assert err.status == 400 and err.code == "invalid_field" and err.param == field and field in err.message


def test_grammar_error_says_where() -> None:
    err = chat_refused(grammar='root ::= "a"\nitem ::= [a-z')
    assert "line 2" in err.message


@pytest.mark.parametrize("grammar", [
    'root ::= "yes" | "no"', "root ::= [0-9]+ (\",\" [0-9]+)*", 'root ::= ("a" | "b"){2,5} "c"? [^\\n]*',
    "root ::= <[1]> !<[2]> <|im_end|>", "root ::= item+\nitem ::= [a-z] # a comment\n\n", 'root ::= "\\u00e9\\x41"',
    'root ::= "a"*?', "root ::= . | [\\]\\[-]",
])
def test_valid_gbnf_passes(grammar: str) -> None:
    check_gbnf(grammar)


@settings(max_examples=400, deadline=None)
@given(text=st.text(alphabet='root:=|"()[]{}<>!^-*+?,.#ab01\\ \n\t\x00é', max_size=60))
def test_gbnf_checker_answers_or_refuses(text: str) -> None:
    """Whatever the text, the checker passes it or raises GrammarError: nothing else."""
    try:
        check_gbnf(text)
    except GrammarError:
        pass


@pytest.mark.parametrize("raw", [b"{not json", b'{"messages": [}', b"\xff\xfe\xfd", b"{'a': 1}", b'{"a":1} x'])
def test_invalid_json(raw: bytes) -> None:
    err = refused("chat", raw)
    assert err.code == "invalid_json" and "JSON" in err.message


@pytest.mark.parametrize("raw", [b"[]", b'[{"messages": []}]', b'"text"', b"42", b"null", b""])
def test_body_must_be_object(raw: bytes) -> None:
    err = refused("chat", raw)
    assert err.code == "invalid_json" and "JSON object" in err.message


def test_missing_messages() -> None:
    err = refused("chat", body({"model": "x"}))
    assert err.param == "messages" and "messages" in err.message


def test_empty_messages() -> None:
    err = chat_refused(messages=[])
    assert err.param == "messages" and "messages" in err.message and "empty" in err.message


@pytest.mark.parametrize("msg", [{"role": "robot", "content": "x"}, {"content": "x"}, {"role": None, "content": "x"},
                                 {"role": ["user"], "content": "x"}])
def test_bad_role(msg: dict[str, Any]) -> None:
    err = chat_refused(messages=[{"role": "user", "content": "ok"}, msg])
    assert err.param == "messages[1].role" and "messages[1].role" in err.message


@pytest.mark.parametrize("msgs", [["hello"], [1], "hello", {"role": "user"}])
def test_messages_of_wrong_shape(msgs: Any) -> None:
    err = chat_refused(messages=msgs)
    assert err.param is not None and err.param.startswith("messages")


def test_missing_prompt() -> None:
    err = refused("completion", body({"max_tokens": 1}))
    assert err.param == "prompt"


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", 5), ("temperature", -0.1), ("temperature", "hot"), ("top_p", 1.5), ("top_k", -1),
    ("min_p", 2), ("repeat_penalty", -1), ("frequency_penalty", 3), ("presence_penalty", -2.5),
    ("max_tokens", -1), ("max_tokens", 1.5), ("max_tokens", "ten"), ("n_predict", -2), ("seed", "s"),
    ("stop", 5), ("stop", [1, 2]), ("stream", [1]), ("ignore_eos", "sometimes"), ("stream_options", "yes"),
    ("model", 3), ("n", "two"), ("cache_prompt", "often"), ("cache_prompt", [True]),
])
def test_invalid_values_name_field(field: str, value: Any) -> None:
    err = chat_refused(**{field: value})
    assert err.code == "invalid_field"
    assert err.param is not None and err.param.split(".")[0] == field
    assert err.message.startswith(field)


def test_temperature_5_completion() -> None:
    err = completion_refused(temperature=5)
    assert err.param == "temperature" and "temperature" in err.message


@pytest.mark.parametrize("value", ["ten", -3])
def test_invalid_max_completion_tokens_refused(value: Any) -> None:
    err = chat_refused(max_completion_tokens=value)
    assert err.param == "max_completion_tokens"


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"messages":' + b"[" * 5000 + b"]" * 5000 + b"}"])
def test_deeply_nested_body_is_400(raw: bytes) -> None:
    refused("chat", raw)


# --------------------------------------------------------------------------- properties


def _check_parse(kind: str, raw: bytes) -> None:
    try:
        req, gen = parse(kind, raw)  # type: ignore[arg-type]
    except ApiError as err:
        assert err.status == 400
        assert isinstance(err.message, str) and err.message
        json.dumps(err.body())
        return
    assert isinstance(gen, GenRequest)
    if kind == "chat":
        # role and text content always; a tool result may carry its call id and name, an assistant its calls
        tool_fields = {"tool": {"tool_call_id", "name"}, "assistant": {"tool_calls"}}
        assert gen.messages and all({"role", "content"} <= set(m) <= {"role", "content"} | tool_fields.get(m["role"], set())
                                    for m in gen.messages), gen.messages
        assert all(isinstance(v, str) for m in gen.messages for v in m.values())
    else:
        assert isinstance(gen.prompt, str)
    assert len(gen.stop) <= 4 and all(isinstance(s, str) for s in gen.stop)
    assert gen.max_tokens is None or gen.max_tokens >= 0
    if gen.sampling.grammar is not None:
        check_gbnf(gen.sampling.grammar)
    assert isinstance(gen.ignore_eos, bool)


@settings(max_examples=500, deadline=None)
@given(kind=st.sampled_from(["chat", "completion"]), raw=st.binary(max_size=512))
def test_arbitrary_bytes_never_crash(kind: str, raw: bytes) -> None:
    _check_parse(kind, raw)


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False),
                     st.text(max_size=12))
_json = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                     max_leaves=12)
_text_part = st.fixed_dictionaries({"type": st.sampled_from(["text", "text", "image_url"]),
                                    "text": st.one_of(st.text(max_size=5), _scalars)})
_message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["system", "user", "assistant", "developer", "tool"]), _scalars)},
    optional={"content": st.one_of(st.text(max_size=10), st.none(), st.lists(_text_part, max_size=3), _json),
              "name": st.text(max_size=5)})


def _maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a valid value, sometimes any JSON value."""
    return st.one_of(valid, valid, valid, _json)


_FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "model": _maybe(st.text(max_size=10)),
    "max_tokens": _maybe(st.integers(-2, 4096)),
    "max_completion_tokens": _maybe(st.integers(-2, 4096)),
    "n_predict": _maybe(st.integers(-3, 4096)),
    "temperature": _maybe(st.floats(-1, 3, allow_nan=False)),
    "top_p": _maybe(st.floats(-0.5, 1.5, allow_nan=False)),
    "top_k": _maybe(st.integers(-2, 100)),
    "min_p": _maybe(st.floats(0, 1)),
    "repeat_penalty": _maybe(st.floats(0, 2)),
    "frequency_penalty": _maybe(st.floats(-3, 3, allow_nan=False)),
    "presence_penalty": _maybe(st.floats(-2, 2)),
    "seed": _maybe(st.integers(-1, 2**40)),
    "stop": _maybe(st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=6))),
    "stream": _maybe(st.booleans()),
    "stream_options": _maybe(st.fixed_dictionaries({}, optional={"include_usage": st.booleans()})),
    "n": _maybe(st.integers(0, 3)),
    "user": _maybe(st.text(max_size=5)),
    "logprobs": _maybe(st.sampled_from([None, False, True, 2])),
    "tools": _maybe(st.sampled_from([None, [], [{"type": "function"}]])),
    "response_format": _maybe(st.sampled_from([None, {"type": "text"}, {"type": "json_object"}, {"type": "json_schema"},
                                               {"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}])),
    "grammar": _maybe(st.one_of(st.text(max_size=20), st.sampled_from(['root ::= "a"', "root ::= (", "root ::= x"]))),
    "json_schema": _maybe(st.sampled_from([{}, {"type": "object"}, {"type": "bogus"}, [], "x", {"$ref": "#/no"}])),
    "echo": _maybe(st.booleans()),
    "ignore_eos": _maybe(st.booleans()),
    "cache_prompt": _maybe(st.booleans()),
    "best_of": _maybe(st.integers(0, 3)),
    "messages": _maybe(st.lists(_message, max_size=4)),
    "prompt": _maybe(st.one_of(st.text(max_size=10), st.lists(st.text(max_size=5), max_size=3))),
}


@st.composite
def _body(draw: st.DrawFn) -> dict[str, Any]:
    """A request with a few fields drawn from _FIELD_VALUES (so most are valid) and maybe a stray one."""
    names = draw(st.lists(st.sampled_from(sorted(_FIELD_VALUES)), max_size=5, unique=True))
    obj: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    if draw(st.booleans()):
        obj.pop(draw(st.sampled_from(["messages", "prompt"])))
    obj.update({n: draw(_FIELD_VALUES[n]) for n in names})
    obj.update(draw(st.dictionaries(st.text(max_size=8), _json, max_size=1)))
    return obj


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["chat", "completion"]), obj=_body())
@example(kind="chat", obj={"messages": [{"role": "tool", "name": "", "tool_call_id": "c1"}]})
@example(kind="chat", obj={"messages": [{"role": "assistant", "content": None,
                                         "tool_calls": [{"id": "c1", "type": "function",
                                                         "function": {"name": "f", "arguments": "{}"}}]}]})
def test_json_objects_never_crash(kind: str, obj: dict[str, Any]) -> None:
    _check_parse(kind, json.dumps(obj).encode())


@settings(max_examples=300, deadline=None)
@given(msgs=st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "developer"]),
                                            "content": st.text(max_size=20)}), min_size=1, max_size=5),
       stop=st.lists(st.text(min_size=1, max_size=5), max_size=4), max_tokens=st.none() | st.integers(0, 10**6),
       temperature=st.none() | st.floats(0, 2), seed=st.none() | st.integers(-(2**63), 2**63))
def test_valid_chat_roundtrip(msgs: list[dict[str, str]], stop: list[str], max_tokens: int | None,
                              temperature: float | None, seed: int | None) -> None:
    req, gen = parse("chat", body({"messages": msgs, "stop": stop, "max_tokens": max_tokens,
                                   "temperature": temperature, "seed": seed}))
    assert gen.messages == [{"role": "system" if m["role"] == "developer" else m["role"], "content": m["content"]}
                            for m in msgs]
    assert gen.stop == stop and gen.max_tokens == max_tokens
    assert gen.sampling.temperature == temperature and gen.sampling.seed == seed


# --------------------------------------------------------------------------- error JSON


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (404, "invalid_request_error"),
                                              (429, "invalid_request_error"), (500, "server_error"),
                                              (503, "unavailable_error")])
def test_api_error_body(status: int, kind: str) -> None:
    err = ApiError(status, "boom", "some_code", "field_x", headers={"Retry-After": "1"})
    assert err.body() == {"error": {"message": "boom", "type": kind, "code": "some_code", "param": "field_x"}}
    assert str(err) == "boom" and err.headers == {"Retry-After": "1"}


def test_api_error_defaults() -> None:
    err = ApiError(400, "bad")
    assert err.body() == {"error": {"message": "bad", "type": "invalid_request_error",
                                    "code": "invalid_request_error", "param": None}}
    assert err.headers == {}


def test_parse_error_body_is_openai_shape() -> None:
    err = chat_refused(temperature=5)
    b = err.body()
    assert set(b) == {"error"} and set(b["error"]) == {"message", "type", "code", "param"}
    assert b["error"]["type"] == "invalid_request_error" and b["error"]["param"] == "temperature"


# --------------------------------------------------------------------------- SSE and responses


def sse_payload(data: bytes) -> Any:
    assert data.startswith(b"data: ") and data.endswith(b"\n\n")
    line = data[len(b"data: "):-2]
    assert b"\n" not in line
    return json.loads(line)


def test_sse_format() -> None:
    out = sse({"a": 1, "b": [1, 2], "s": "héllo\nworld"})
    assert out == b'data: {"a":1,"b":[1,2],"s":"h\xc3\xa9llo\\nworld"}\n\n'
    assert sse_payload(out) == {"a": 1, "b": [1, 2], "s": "héllo\nworld"}


def test_done_marker() -> None:
    assert DONE == b"data: [DONE]\n\n"


def test_chat_chunks() -> None:
    first = sse_payload(chunk("chat", "chatcmpl-1", "m", 1700000000, "Hel", None, "fp", first=True))
    assert first == {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m",
                     "system_fingerprint": "fp",
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"},
                                  "finish_reason": None, "logprobs": None}]}
    mid = sse_payload(chunk("chat", "chatcmpl-1", "m", 1700000000, "lo", None, "fp"))
    assert mid["choices"][0]["delta"] == {"content": "lo"}
    last = sse_payload(chunk("chat", "chatcmpl-1", "m", 1700000000, None, "stop", "fp"))
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop"


def test_completion_chunks() -> None:
    c = sse_payload(chunk("completion", "cmpl-1", "m", 5, "abc", None, "fp"))
    assert c["object"] == "text_completion"
    assert c["choices"] == [{"index": 0, "text": "abc", "finish_reason": None, "logprobs": None}]
    end = sse_payload(chunk("completion", "cmpl-1", "m", 5, None, "length", "fp"))
    assert end["choices"][0]["text"] == "" and end["choices"][0]["finish_reason"] == "length"


def test_usage_chunk() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    for kind, obj in (("chat", "chat.completion.chunk"), ("completion", "text_completion")):
        u = sse_payload(usage_chunk(kind, "id", "m", 9, usage, "fp"))
        assert u == {"id": "id", "object": obj, "created": 9, "model": "m", "system_fingerprint": "fp",
                     "choices": [], "usage": usage}


def test_full_response_shapes() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    r = full_response("chat", "chatcmpl-x", "m", "hi", "stop", usage, "fp", {"predicted_ms": 1.0})
    assert r["object"] == "chat.completion" and isinstance(r["created"], int)
    assert r["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop",
                             "logprobs": None}]
    assert r["usage"] == usage and r["system_fingerprint"] == "fp" and r["timings"] == {"predicted_ms": 1.0}
    c = full_response("completion", "cmpl-x", "m", "hi", "length", usage, "fp", {})
    assert c["object"] == "text_completion"
    assert c["choices"] == [{"index": 0, "text": "hi", "finish_reason": "length", "logprobs": None}]
    json.dumps(r)
    json.dumps(c)


def test_new_id() -> None:
    a, b = new_id("chat"), new_id("chat")
    assert a.startswith("chatcmpl-") and len(a) == len("chatcmpl-") + 24 and a != b
    assert new_id("completion").startswith("cmpl-")


# llama-server request fields the engine does not honour: a non-default value is refused by name (a
# lazy grammar, say, must never come back as unconstrained text with a 200); the default passes.
LLAMA_SERVER_UNHONOURED = [
    ("grammar_lazy", True, False), ("grammar_triggers", [{"type": 0, "value": "x"}], []),
    ("preserved_tokens", ["<tool>"], []), ("n_probs", 5, 0),
    ("mirostat", 2, 0), ("typical_p", 0.9, 1.0), ("top_n_sigma", 1.5, -1.0), ("xtc_probability", 0.5, 0.0),
    ("dry_multiplier", 0.8, 0.0), ("dynatemp_range", 0.5, 0.0), ("repeat_last_n", 256, 64),
    ("penalty_last_n", 256, 64), ("samplers", ["top_k", "temperature"], None)
]


@pytest.mark.parametrize("field, value, default", LLAMA_SERVER_UNHONOURED, ids=[f[0] for f in LLAMA_SERVER_UNHONOURED])
def test_llama_server_fields_not_honoured_are_refused_by_name(field: str, value: Any, default: Any) -> None:
    for refuse in (chat_refused, completion_refused):
        err = refuse(**{field: value})
        assert err.code == "unsupported_field" and err.param == field and field in err.message
    chat(**{field: default})  # the default changes nothing: accepted
    completion(**{field: default})


def test_lora_is_read_as_llama_server_takes_it() -> None:
    """A request's LoRA scales by adapter id travel on (the engine checks the ids against its adapters);
    a malformed entry is refused naming the field."""
    for parse_one in (chat, completion):
        _, gen = parse_one(lora=[{"id": 0, "scale": 0.5}, {"id": 2}])
        assert [(e.id, e.scale) for e in gen.lora] == [(0, 0.5), (2, 0.0)]
        assert parse_one()[1].lora is None
    for bad in ([{"id": -1, "scale": 1}], [{"scale": 1}], [{"id": 0, "scale": 1e9}], {"id": 0},
                [{"id": 0, "scale": 1}] * 65):
        for refuse in (chat_refused, completion_refused):
            err = refuse(lora=bad)
            assert err.status == 400 and err.param is not None and err.param.startswith("lora"), (bad, err.message)
