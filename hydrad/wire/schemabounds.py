"""A JSON schema's cost, bounded before the converter makes its grammar.

llama-cpp-python's converter writes a repetition out in full: ``"minItems": 100000000`` is a
string of a hundred million rule names (the coordinator grew by 4.7 GB making it), and an
object's optional properties cost it time in the square of their count. Its grammar would then
be refused anyway, for its size or for the ways it may begin (:mod:`hydrad.wire.grammar`). This
walk, linear in the schema, finds those schemas first and names the field:

- a **lower bound of the grammar's length**: every property puts its name into the grammar
  as a JSON literal, in a rule line of its own; every repetition
  (``minItems``/``maxItems``, ``minLength``/``maxLength``, a pattern's ``{m,n}``) writes at
  least a few characters per repeat; every ``enum``/``const`` value its JSON. A schema whose
  bound passes :data:`~hydrad.wire.grammar.MAX_GRAMMAR_CHARS` would make a grammar that is
  refused, so it is refused here, in microseconds rather than after the expansion;
- **ways to begin**: an object's optional properties, an ``enum``, ``anyOf``/``oneOf`` or a
  list of types are alternatives of one rule, which llama.cpp's automaton tracks all at once;
  more than :data:`~hydrad.wire.grammar.MAX_WAYS` would be refused after conversion too.

Both bounds only ever refuse what the converter's own output would have been refused for, so
a schema accepted before is accepted now; they make the refusal cheap, not stricter.
"""

from __future__ import annotations

import json
import re
from typing import Any

_QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")
_PER_PROPERTY = 30  # a property's rule line besides its JSON literal: ``-kv ::= "\"" \"" space ":" space x``
_PER_REPEAT = 5  # a repeated rule's name and its separator: at least ``char `` (or ``"," space item``)


class SchemaTooCostly(ValueError):
    """The schema's grammar would be refused; the message names the field and the bound."""


def _pointer(path: list[str]) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path) if path else "/"


def _count(schema: dict[str, Any], key: str, path: list[str]) -> int:
    value = schema.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaTooCostly(f"{_pointer(path + [key])} must be a non-negative integer")
    return value


def _pattern_repeats(pattern: str) -> int:
    """At least how many units a pattern's ``{m,n}`` quantifiers write (each repeat once, opened or not)."""
    total = 0
    for low, high in _QUANTIFIER.findall(pattern):
        total += max(int(low or 0), int(high or 0)) if len(low) < 12 and len(high) < 12 else 10**12
    return total


def _branch(node: dict[str, Any], path: list[str], max_ways: int) -> tuple[int, list[tuple[Any, list[str]]]]:
    """What the converter makes of one schema node, taking the branch its ``visit`` takes: at least
    how many characters, and the sub-schemas it visits. Nothing else of the node is counted, so
    the sum stays below the grammar's real length."""
    ways = next((k for k in ("oneOf", "anyOf") if k in node), None)
    if "$ref" in node:
        return 0, []
    if ways is not None:
        alts = node[ways]
        if isinstance(alts, list) and len(alts) > max_ways:
            raise SchemaTooCostly(f"{_pointer(path + [ways])} has {len(alts)} alternatives; at most {max_ways} are "
                                  "accepted (llama.cpp tracks every way a rule may begin at once)")
        return 0, [(alt, path + [ways, str(i)]) for i, alt in enumerate(alts)] if isinstance(alts, list) else []
    kind = node.get("type")
    if isinstance(kind, list):
        if len(kind) > max_ways:
            raise SchemaTooCostly(f"{_pointer(path + ['type'])} lists {len(kind)} types; at most {max_ways} are accepted")
        return 0, []
    if "const" in node:
        return len(json.dumps(node["const"], ensure_ascii=False)), []
    if "enum" in node:
        values = node["enum"]
        if isinstance(values, list) and len(values) > max_ways:
            raise SchemaTooCostly(f"{_pointer(path + ['enum'])} has {len(values)} values; at most {max_ways} are "
                                  "accepted (llama.cpp tracks every way a rule may begin at once)")
        return (sum(len(json.dumps(v, ensure_ascii=False)) for v in values) if isinstance(values, list) else 0), []
    props = node.get("properties")
    if kind in (None, "object") and (props is not None or node.get("additionalProperties", True) is not True):
        if not isinstance(props, dict):
            return 0, []
        required = node.get("required")
        needed = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        optional = sum(1 for name in props if name not in needed)
        if optional > max_ways:
            raise SchemaTooCostly(f"{_pointer(path + ['properties'])} has {optional} optional properties; at most "
                                  f"{max_ways} are accepted (each is a way the object may go on, and llama.cpp "
                                  "tracks every one at once): list the others in 'required'")
        return (sum(len(name) + _PER_PROPERTY for name in props),
                [(value, path + ["properties", name]) for name, value in props.items()])
    if kind in (None, "object") and "allOf" in node:
        return 0, []
    if kind in (None, "array") and ("items" in node or "prefixItems" in node):
        items = node.get("items") or node.get("prefixItems")
        if isinstance(items, list):
            return 0, [(item, path + ["items", str(i)]) for i, item in enumerate(items)]
        repeats = max(_count(node, "minItems", path), _count(node, "maxItems", path))
        return repeats * _PER_REPEAT, [(items, path + ["items"])]
    pattern = node.get("pattern")
    if kind in (None, "string") and isinstance(pattern, str):
        return _pattern_repeats(pattern), []
    if kind == "string":
        return max(_count(node, "minLength", path), _count(node, "maxLength", path)) * _PER_REPEAT, []
    return 0, []


def check(schema: Any, limit_chars: int, max_ways: int) -> None:
    """Raises SchemaTooCostly when ``schema``'s grammar would pass ``limit_chars`` characters or a
    rule of it could begin in more than ``max_ways`` ways (the module says why)."""
    bound = 0
    worst = ("/", 0)  # the node that added most, for the message
    stack: list[tuple[Any, list[str]]] = [(schema, [])]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        added, children = _branch(node, path, max_ways)
        stack.extend(children)
        if added > worst[1]:
            worst = (_pointer(path), added)
        bound += added
        if bound > limit_chars:
            raise SchemaTooCostly(f"the grammar made from this schema would have more than {limit_chars} characters, "
                                  f"the most accepted (at {worst[0]}: at least {worst[1]}, from its repetition counts, "
                                  "properties and values); it is refused before it is made")
