"""A JSON schema's shape, checked keyword by keyword before it becomes a grammar.

The converter that makes a grammar of a schema (llama.cpp's, through llama-cpp-python) reads what it
knows and skips the rest: ``{"anyOf": {}}``, ``{"additionalProperties": 5}`` or ``{"minItems": -1}``
were accepted and ignored, and ``{"type": 5}`` or ``{"properties": []}`` were refused with the
converter's own exception (``AssertionError: Unrecognized schema``, ``'list' object has no attribute
'items'``). A request whose schema says something it cannot mean should learn that, and where. Here
every keyword of JSON Schema that constrains what matches (the ones the converter reads, and the
others, which it would silently drop) must have the type the specification gives it; the first that
does not is refused with its JSON pointer and what it should be: ``/properties/age/type: 5 is not a
type (one of "array", "boolean", ...)``. Annotations (``title``, ``description``, ``examples``,
``default``, ``$comment``) and unknown keywords are left alone, as the specification says; so is
what only conversion can judge (a pattern's regular expression, a ``$ref``'s target). A schema
written as ``true`` or ``false`` is valid JSON Schema but the converter reads it only as
``additionalProperties`` (and the like): elsewhere it is refused by name rather than met with the
converter's exception.

The walk is linear in the schema and uses no recursion (nesting is bounded where the JSON is parsed).
"""

from __future__ import annotations

from typing import Any

TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMAS = ("not", "additionalProperties", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
            "contains", "propertyNames", "if", "then", "else")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains",
           "maxContains")
_NUMBERS = ("minimum", "maximum", "multipleOf")
_STRINGS = ("pattern", "format", "$ref", "$id", "$anchor", "$schema", "contentEncoding", "contentMediaType")
_BOOLEAN_OK = ("additionalProperties", "unevaluatedProperties", "additionalItems", "unevaluatedItems")
_RANGES = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"),
           ("minimum", "maximum"))


class SchemaInvalid(ValueError):
    """The schema breaks JSON Schema's own rules; the message gives the pointer and the rule."""


def _pointer(path: list[str]) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path) if path else "(the schema)"


def _kind(value: Any) -> str:
    """How JSON names what ``value`` is, for the messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _is_schema(value: Any) -> bool:
    return isinstance(value, (dict, bool))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check(schema: Any) -> None:
    """SchemaInvalid naming the first keyword of ``schema`` (or of a schema inside it) whose value
    JSON Schema does not allow there."""
    stack: list[tuple[Any, list[str]]] = [(schema, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, bool):  # true and false are schemas (anything, nothing), which the converter
            if path and path[-1] in _BOOLEAN_OK:  # reads only where they say whether more may follow
                continue
            raise SchemaInvalid(f"{_pointer(path)}: a schema written as {str(node).lower()} is not supported here"
                                + ("; write {} for any value" if node else ""))
        if not isinstance(node, dict):
            raise SchemaInvalid(f"{_pointer(path)} must be a schema (an object, or true or false), not {_kind(node)}")
        stack.extend(_children(node, path))


def _bad(path: list[str], key: str, rule: str) -> SchemaInvalid:
    return SchemaInvalid(f"{_pointer(path + [key])}: {rule}")


def _children(node: dict[str, Any], path: list[str]) -> list[tuple[Any, list[str]]]:
    """Check ``node``'s own keywords; the schemas inside it, to be checked in turn."""
    out: list[tuple[Any, list[str]]] = []
    if "type" in node:
        kind = node["type"]
        kinds = kind if isinstance(kind, list) else [kind]
        if isinstance(kind, list) and not kind:
            raise _bad(path, "type", "an empty list of types matches nothing; name at least one")
        for k in kinds:
            if not isinstance(k, str) or k not in TYPES:
                shown = repr(k) if isinstance(k, str) else _kind(k)
                raise _bad(path, "type", f"{shown} is not a type (one of {', '.join(TYPES)})")
        if isinstance(kind, list) and len(set(kinds)) != len(kinds):
            raise _bad(path, "type", "lists a type twice")
    for key in _SCHEMA_MAPS:
        if key in node:
            value = node[key]
            if not isinstance(value, dict):
                raise _bad(path, key, f"must be an object mapping names to schemas, not {_kind(value)}")
            out += [(sub, path + [key, name]) for name, sub in value.items()]
    for key in _SCHEMA_LISTS:
        if key in node:
            value = node[key]
            if not isinstance(value, list) or not value:
                what = "an empty array" if isinstance(value, list) else _kind(value)
                raise _bad(path, key, f"must be a non-empty array of schemas, not {what}")
            out += [(sub, path + [key, str(i)]) for i, sub in enumerate(value)]
    for key in _SCHEMAS:
        if key in node:
            value = node[key]
            if not _is_schema(value):
                raise _bad(path, key, f"must be a schema (an object, or true or false), not {_kind(value)}")
            out.append((value, path + [key]))
    if "items" in node:
        items = node["items"]
        if isinstance(items, list):  # the tuple form of earlier drafts
            out += [(sub, path + ["items", str(i)]) for i, sub in enumerate(items)]
        elif _is_schema(items):
            out.append((items, path + ["items"]))
        else:
            raise _bad(path, "items", f"must be a schema (or, in earlier drafts, an array of them), not {_kind(items)}")
    if "required" in node:
        req = node["required"]
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            raise _bad(path, "required", "must be an array of property names (strings)")
        if len(set(req)) != len(req):
            raise _bad(path, "required", "names a property twice")
    if "dependentRequired" in node:
        dep = node["dependentRequired"]
        if not isinstance(dep, dict) or not all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                                                for v in dep.values()):
            raise _bad(path, "dependentRequired", "must be an object mapping names to arrays of names")
    if "enum" in node:
        values = node["enum"]
        if not isinstance(values, list) or not values:
            what = "an empty array: nothing would match" if isinstance(values, list) else _kind(values)
            raise _bad(path, "enum", f"must be a non-empty array of values, not {what}")
    for key in _COUNTS:
        if key in node:
            value = node[key]
            if not _number(value) or value < 0 or value != int(value):
                raise _bad(path, key, f"must be a non-negative integer, not {value!r}"[:200])
    for key in _NUMBERS:
        if key in node and not _number(node[key]):
            raise _bad(path, key, f"must be a number, not {_kind(node[key])}")
    if "multipleOf" in node and node["multipleOf"] <= 0:
        raise _bad(path, "multipleOf", "must be greater than 0")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):  # a number, or (draft 4) a boolean
        if key in node and not (_number(node[key]) or isinstance(node[key], bool)):
            raise _bad(path, key, f"must be a number, not {_kind(node[key])}")
    for key in _STRINGS:
        if key in node and not isinstance(node[key], str):
            raise _bad(path, key, f"must be a string, not {_kind(node[key])}")
    for key in ("uniqueItems", "readOnly", "writeOnly", "deprecated"):
        if key in node and not isinstance(node[key], bool):
            raise _bad(path, key, f"must be true or false, not {_kind(node[key])}")
    for low, high in _RANGES:
        if low in node and high in node and node[low] > node[high]:
            raise SchemaInvalid(f"{_pointer(path)}: {low} {node[low]} is greater than {high} {node[high]}: "
                                "nothing would match")
    return out
