"""A schema's grammar cost is bounded before the converter runs: the costly schemas that stalled
the pool are refused in milliseconds naming their field, and the bound never refuses a schema
whose real grammar would have been accepted (hypothesis checks it against the converter)."""

from __future__ import annotations

import gc
import json
import time
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hydrad.wire import grammar, schemabounds
from hydrad.wire.grammar import GrammarError, MAX_GRAMMAR_CHARS, MAX_WAYS, schema_grammar
from hydrad.wire.schemabounds import SchemaTooCostly

pytestmark = pytest.mark.serial  # refusals are timed (under 0.5 s): alone, not beside other tests


def _refused_fast(schema: dict[str, Any], *words: str) -> str:
    gc.collect()  # the collector's pass over what earlier tests left is not the refusal's work
    gc.disable()
    tracemalloc.start()
    t0 = time.thread_time()  # this thread's CPU: the work the refusal cost, whatever else loads the machine
    try:
        with pytest.raises(GrammarError) as err:
            schema_grammar(schema)
    finally:
        gc.enable()
    took = time.thread_time() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert took < 0.5 and peak < 8 << 20, (took, peak)
    for w in words:
        assert w in str(err.value), err.value
    return str(err.value)


def test_a_hundred_million_min_items_is_refused_before_it_is_made() -> None:
    msg = _refused_fast({"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"},
                                                                 "minItems": 100_000_000}}, "required": ["xs"]},
                        "/properties/xs", str(MAX_GRAMMAR_CHARS))
    assert "refused before it is made" in msg


@pytest.mark.parametrize("schema,field", [
    ({"type": "string", "maxLength": 10**9}, "/"),
    ({"type": "string", "pattern": "^a{1000000000}$"}, "/"),
    ({"type": "array", "items": {"type": "array", "items": {"type": "string"}, "maxItems": 50_000}}, "/items"),
])
def test_other_repetitions_are_refused_naming_the_node(schema: dict[str, Any], field: str) -> None:
    _refused_fast(schema, f"at {field}:")


def test_many_optional_properties_and_alternatives_are_refused_by_their_ways() -> None:
    props = {f"p{i}": {"type": "string"} for i in range(MAX_WAYS + 1)}
    _refused_fast({"type": "object", "properties": props}, "optional properties", "'required'")
    _refused_fast({"enum": list(range(MAX_WAYS + 1))}, "/enum", "values")
    _refused_fast({"anyOf": [{"const": i} for i in range(MAX_WAYS + 1)]}, "/anyOf", "alternatives")


def test_six_thousand_five_hundred_properties_are_refused_at_once() -> None:
    digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    props = {digits[i // 62 % 62] * (i >= 3844) + digits[i // 62 % 62] + digits[i % 62]: {} for i in range(6500)}
    assert len(props) == 6500  # the issue's schema: 6,500 properties, here in under 64 KB
    assert len(json.dumps(props, separators=(",", ":"))) < grammar.MAX_SCHEMA_CHARS
    _refused_fast({"type": "object", "properties": props}, "6500 optional properties")
    names = [f"p{i}" for i in range(2500)]  # all required: linear to convert, but too long a grammar
    _refused_fast({"type": "object", "properties": {n: {} for n in names}, "required": names},
                  "more than 65536 characters")


def test_ordinary_schemas_pass_the_bound() -> None:
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40}, "tags": {"type": "array", "items": {"type": "string"},
                                                                             "maxItems": 8},
        "kind": {"enum": ["a", "b"]}, "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}},
        "required": ["name"]}
    schemabounds.check(schema, MAX_GRAMMAR_CHARS, MAX_WAYS)
    assert "root ::=" in schema_grammar(schema)


def test_a_malformed_count_is_named() -> None:
    with pytest.raises(SchemaTooCostly, match="/minItems must be a non-negative integer"):
        schemabounds.check({"type": "array", "items": {}, "minItems": -1}, MAX_GRAMMAR_CHARS, MAX_WAYS)


_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=6)
_leaf = st.one_of(
    st.just({"type": "string"}), st.just({"type": "integer"}), st.just({}),
    st.builds(lambda lo, hi: {"type": "string", "minLength": lo, "maxLength": max(lo, hi)},
              st.integers(0, 30), st.integers(0, 30)),
    st.builds(lambda v: {"enum": v}, st.lists(st.one_of(st.integers(), _names), min_size=1, max_size=5)),
    st.builds(lambda v: {"const": v}, _names),
    st.builds(lambda n, m: {"type": "string", "pattern": f"^(ab){{{n},{n + m}}}c{{2}}$"}, st.integers(0, 9),
              st.integers(0, 9)),
)


def _object(children: Any) -> Any:
    return st.builds(lambda props, req: {"type": "object", "properties": props,
                                         "required": [k for i, k in enumerate(props) if i % 2 == 0 or req]},
                     st.dictionaries(_names, children, min_size=1, max_size=6), st.booleans())


_schemas = st.recursive(_leaf, lambda children: st.one_of(
    _object(children),
    st.builds(lambda it, lo, extra: {"type": "array", "items": it, "minItems": lo, "maxItems": lo + extra},
              children, st.integers(0, 12), st.integers(0, 6)),
    st.builds(lambda alts: {"anyOf": alts}, st.lists(children, min_size=1, max_size=4)),
), max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_schemas)
def test_the_bound_never_passes_the_real_grammar_length(schema: dict[str, Any]) -> None:
    try:
        real = grammar._convert(json.dumps(schema), "")
    except Exception:  # noqa: BLE001 - a schema the converter refuses says nothing about the bound
        return
    schemabounds.check(schema, len(real), 10**9)  # the bound, with the real length as the limit, holds


def test_grammars_are_remembered_by_their_schema_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = grammar._convert

    def counted(text: str, name: str) -> str:
        calls.append(text)
        return real(text, name)

    monkeypatch.setattr(grammar, "_convert", counted)
    monkeypatch.setattr(grammar, "MADE_CHARS", 4000)
    schema = {"type": "object", "properties": {"remembered": {"type": "integer"}}, "required": ["remembered"]}
    first = schema_grammar(schema)
    assert schema_grammar(json.loads(json.dumps(schema))) == first and len(calls) == 1
    for i in range(40):  # others push it out: the remembered text stays within MADE_CHARS
        schema_grammar({"type": "object", "properties": {f"p{i}": {"type": "integer"}}, "required": [f"p{i}"]})
    assert grammar._made_chars <= 4000
    schema_grammar(schema)
    assert len([c for c in calls if "remembered" in c]) == 2
