"""A schema whose keywords break JSON Schema's own rules is refused with the keyword's pointer and the
rule, before any grammar is made; what real clients send (pydantic's schemas, tools) passes."""

from __future__ import annotations

from typing import Any

import pytest

from hydrad.wire.grammar import GrammarError, check_schema, schema_grammar
from hydrad.wire.schemashape import SchemaInvalid, check

REFUSED: list[tuple[Any, str]] = [
    ({"type": 5}, "/type: a number is not a type"),
    ({"type": []}, "/type: an empty list of types"),
    ({"type": ["string", "string"]}, "/type: lists a type twice"),
    ({"properties": []}, "/properties: must be an object mapping names to schemas, not an array"),
    ({"properties": {"a": 5}}, "/properties/a must be a schema"),
    ({"anyOf": {}}, "/anyOf: must be a non-empty array of schemas, not an object"),
    ({"oneOf": []}, "/oneOf: must be a non-empty array of schemas, not an empty array"),
    ({"items": 5}, "/items: must be a schema"),
    ({"additionalProperties": 5}, "/additionalProperties: must be a schema"),
    ({"required": "name"}, "/required: must be an array of property names"),
    ({"required": ["a", "a"]}, "/required: names a property twice"),
    ({"enum": 5}, "/enum: must be a non-empty array of values, not a number"),
    ({"enum": []}, "/enum: must be a non-empty array of values, not an empty array"),
    ({"minItems": -1}, "/minItems: must be a non-negative integer, not -1"),
    ({"maxLength": 2.5}, "/maxLength: must be a non-negative integer, not 2.5"),
    ({"minLength": True}, "/minLength: must be a non-negative integer, not True"),
    ({"minimum": "5"}, "/minimum: must be a number, not a string"),
    ({"multipleOf": 0}, "/multipleOf: must be greater than 0"),
    ({"pattern": 5}, "/pattern: must be a string"),
    ({"$ref": 1}, "/$ref: must be a string"),
    ({"uniqueItems": "yes"}, "/uniqueItems: must be true or false"),
    ({"minLength": 5, "maxLength": 2}, "minLength 5 is greater than maxLength 2"),
    ({"$defs": {"x": {"type": "object", "properties": {"y": {"type": "strng"}}}}},
     "/$defs/x/properties/y/type: 'strng' is not a type"),
    ({"properties": {"a/b": {"type": 1}}}, "/properties/a~1b/type"),
    ({"anyOf": [{"type": "string"}, True]}, "/anyOf/1: a schema written as true is not supported here"),
]

ACCEPTED: list[Any] = [
    {},
    {"type": "object"},
    {"type": ["string", "null"]},
    {"type": "object", "additionalProperties": False, "properties": {"a": {"type": "string"}}, "required": ["a"]},
    # as pydantic writes a model with an optional nested one and an enum
    {"$defs": {"Colour": {"enum": ["red", "green"], "title": "Colour", "type": "string"},
               "Item": {"properties": {"n": {"title": "N", "type": "integer", "minimum": 0}}, "required": ["n"],
                        "title": "Item", "type": "object"}},
     "properties": {"colour": {"$ref": "#/$defs/Colour"},
                    "item": {"anyOf": [{"$ref": "#/$defs/Item"}, {"type": "null"}], "default": None},
                    "tags": {"items": {"type": "string"}, "maxItems": 3, "title": "Tags", "type": "array"}},
     "required": ["colour"], "title": "Thing", "type": "object"},
    {"type": "number", "exclusiveMinimum": True, "minimum": 0},  # draft 4
    {"type": "string", "x-vendor": [1, 2], "description": 5},  # unknown keywords and annotations are left alone
]


@pytest.mark.parametrize("schema,problem", REFUSED)
def test_a_keyword_against_the_rules_is_refused_by_name(schema: Any, problem: str) -> None:
    with pytest.raises(SchemaInvalid) as shape:
        check(schema)
    assert problem in str(shape.value)
    with pytest.raises(GrammarError, match="the schema cannot be used: "):  # every door's path
        schema_grammar(schema)
    with pytest.raises(GrammarError):
        check_schema(schema)


@pytest.mark.parametrize("schema", ACCEPTED)
def test_what_clients_send_is_accepted(schema: Any) -> None:
    check(schema)
    assert schema_grammar(schema)
