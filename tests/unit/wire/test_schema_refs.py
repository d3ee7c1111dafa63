"""Recursive and local ``$ref``s become grammars, as llama.cpp's converter makes them; references
outside the schema, or to nothing, are refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from hydrad.wire.grammar import GrammarError, check_gbnf, schema_grammar

TREE = {"type": "object", "properties": {"name": {"type": "string"},
                                         "children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["name", "children"]}
LIST = {"$defs": {"node": {"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#/$defs/node"},
                                                                               {"type": "null"}]}},
                           "required": ["next"]}}, "$ref": "#/$defs/node"}
ESCAPED = {"definitions": {"a/b": {"type": "integer"}, "c~d": {"type": "string"}},
           "type": "object", "properties": {"x": {"$ref": "#/definitions/a~1b"}, "y": {"$ref": "#/definitions/c~0d"}},
           "required": ["x", "y"]}


@pytest.mark.parametrize("schema", [TREE, LIST, ESCAPED, {"type": "object", "properties": {"a": {"$ref": "#"}}}])
def test_recursive_and_local_references_make_usable_grammars(schema: dict[str, Any]) -> None:
    gbnf = schema_grammar(schema)
    check_gbnf(gbnf)
    assert "root ::=" in gbnf


def test_a_tree_refers_to_itself_through_a_named_rule() -> None:
    gbnf = schema_grammar(TREE)
    assert "children-item ::= whole-schema" in gbnf and "\nwhole-schema ::= " in gbnf


@pytest.mark.parametrize("ref,words", [("http://example.com/s.json", "only references inside"),
                                       ("#/nowhere", "names nothing"), ("other.json#/a", "only references inside"),
                                       ("#/properties/a/type", "not a schema")])
def test_other_references_are_refused_by_name(ref: str, words: str) -> None:
    with pytest.raises(GrammarError, match=words):
        schema_grammar({"type": "object", "properties": {"a": {"type": "string"}, "b": {"$ref": ref}}})
