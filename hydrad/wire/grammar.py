"""Constrained output: GBNF grammars and JSON schemas, checked before they reach llama.cpp.

llama.cpp's grammar parser is trusted with nothing a client wrote until this module has read
it: the parser recurses once per nested group (a grammar of 30,000 opening parentheses
overflows the engine thread's stack), copies a repeated literal once per repetition (a long
literal repeated 1,999 times is a gigabyte of rule elements), and prints the whole grammar to
the log on every syntax error. The checker below follows llama.cpp's own grammar
(``src/llama-grammar.cpp``), so what it accepts llama.cpp parses, within bounds on size,
nesting and expanded elements. What only the model's vocabulary can decide (a ``<token>``
that must be exactly one token) and left recursion are left to llama.cpp, which refuses both
with a NULL sampler; the engine answers that with a 400 too.

Both doors (the engine's HTTP plane and the coordinator's front door) turn a request's
``grammar``, ``json_schema`` or JSON ``response_format`` into one GBNF string here, and only
that string travels on to the engine. Nothing here loads libllama: the coordinator has none.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import threading
from collections import OrderedDict
from types import ModuleType
from typing import Any

from hydrad.wire import schemabounds, schemashape
from hydrad.wire.schemabounds import SchemaTooCostly

MAX_GRAMMAR_CHARS = 65536
"""Longest GBNF accepted, given or made from a schema (llama.cpp parses it on the engine thread)."""

MAX_SCHEMA_CHARS = 65536
"""Longest JSON schema accepted, measured as compact JSON."""

MAX_TOOLS_GRAMMAR_CHARS = 2 << 20
"""Longest grammar made from a request's tools (every tool's call schema in one): each tool's own
schema is held to the limits above, and 128 ordinary tools make 150,000 characters, which took
42 ms to make, 29 ms to check and 4 ms for llama.cpp to build on the 2-core machine."""

MAX_NESTING = 128
"""Deepest nesting of parenthesised groups; llama.cpp's parser recurses once per level."""

MAX_ELEMENTS = 1 << 20
"""Most rule elements a grammar may expand to (8 bytes each in llama.cpp), repetitions included."""

MAX_REPETITION = 2000
"""llama.cpp's MAX_REPETITION_THRESHOLD: a repetition count above it is an error there."""

MAX_WAYS = 1024
"""Most ways a rule may begin (or derive nothing). llama.cpp tracks every way at once, one stack
each, deduplicated in quadratic time: twenty rules of two alternatives each, each alternative
starting with the next rule, are a million stacks, and a 300-byte grammar held the engine thread
for minutes before this bound."""

_TERMINAL = -1

_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('tnr\\"[]-')


class GrammarError(ValueError):
    """A grammar or schema that will not be used; the message says what and where."""


class _Parser:
    """A reading of GBNF that mirrors llama.cpp's recursive-descent parser, with bounds."""

    def __init__(self, src: str) -> None:
        self.s = src
        self.n = len(src)
        self.symbols: dict[str, int] = {}
        self.shapes: dict[int, list[list[int]]] = {}  # rule id -> alternatives: rule ids, or _TERMINAL
        self.referenced: dict[int, str] = {}
        self.elements = 0
        self.depth = 0

    def fail(self, what: str, pos: int) -> GrammarError:
        line = self.s.count("\n", 0, pos) + 1
        col = pos - (self.s.rfind("\n", 0, pos) + 1) + 1
        return GrammarError(f"{what} at line {line}, column {col}")

    def at(self, pos: int) -> str:
        return self.s[pos] if pos < self.n else ""

    def symbol(self, name: str) -> int:
        return self.symbols.setdefault(name, len(self.symbols))

    def new_symbol(self, base: str) -> int:
        sid = len(self.symbols)
        self.symbols[f"{base}_{sid}"] = sid
        return sid

    def grow(self, count: int, pos: int) -> None:
        self.elements += count
        if self.elements > MAX_ELEMENTS:
            raise self.fail(f"the grammar expands to more than {MAX_ELEMENTS} elements", pos)

    def space(self, pos: int, newline_ok: bool) -> int:
        while pos < self.n:
            c = self.s[pos]
            if c == "#":
                while pos < self.n and self.s[pos] not in "\r\n":
                    pos += 1
            elif c in " \t" or (newline_ok and c in "\r\n"):
                pos += 1
            else:
                break
        return pos

    def name(self, pos: int) -> int:
        end = pos
        while end < self.n and self.s[end] in _WORD:
            end += 1
        if end == pos:
            raise self.fail("expecting a rule name", pos)
        return end

    def integer(self, pos: int) -> int:
        end = pos
        while end < self.n and self.s[end] in _DIGITS:
            end += 1
        if end == pos:
            raise self.fail("expecting an integer", pos)
        return end

    def char(self, pos: int) -> int:
        if self.at(pos) == "\\":
            esc = self.at(pos + 1)
            width = {"x": 2, "u": 4, "U": 8}.get(esc)
            if width is not None:
                digits = self.s[pos + 2:pos + 2 + width]
                if len(digits) != width or not set(digits) <= _HEX:
                    raise self.fail(f"expecting {width} hex digits after \\{esc}", pos)
                return pos + 2 + width
            if esc in _SIMPLE_ESCAPES and esc:
                return pos + 2
            raise self.fail("unknown escape", pos)
        if pos >= self.n:
            raise self.fail("unexpected end of input", pos)
        return pos + 1

    def token(self, pos: int) -> int:
        pos += 1
        if self.at(pos) == "[":
            end = self.integer(pos + 1)
            if int(self.s[pos + 1:end]) >= 2**32:
                raise self.fail("token id out of range", pos)
            if self.at(end) != "]" or self.at(end + 1) != ">":
                raise self.fail("expecting ']>'", end)
            return end + 2
        end = self.s.find(">", pos)
        if end < 0:
            raise self.fail("expecting '>'", pos)
        return end + 1

    def alternates(self, pos: int, rule: str, rule_id: int, nested: bool) -> int:
        size, items, pos = self.sequence(pos, rule, nested)
        alts = [items]
        while self.at(pos) == "|":
            more, items, pos = self.sequence(self.space(pos + 1, True), rule, nested)
            size += more + 1
            alts.append(items)
        self.shapes[rule_id] = alts
        self.grow(size + 1, pos)
        return pos

    def sequence(self, pos: int, rule: str, nested: bool) -> tuple[int, list[int], int]:
        """Reads one alternative; returns its size in elements, its shape (the rules it refers to
        and a _TERMINAL per terminal) and where it ends."""
        size = last = 0
        n_prev = 1
        items: list[int] = []
        shape: list[int] = []
        while pos < self.n:
            c = self.s[pos]
            start = pos
            if c == '"':
                pos += 1
                last = 0
                while self.at(pos) != '"':
                    if pos >= self.n:
                        raise self.fail("unterminated string", start)
                    pos = self.char(pos)
                    last += 1
                n_prev, shape = 1, [_TERMINAL] if last else []
                pos = self.space(pos + 1, nested)
            elif c == "[":
                pos += 1
                if self.at(pos) == "^":
                    pos += 1
                last = 0
                while self.at(pos) != "]":
                    if pos >= self.n:
                        raise self.fail("unterminated character class", start)
                    pos = self.char(pos)
                    last += 1
                    if self.at(pos) == "-" and self.at(pos + 1) != "]":
                        if pos + 1 >= self.n:
                            raise self.fail("unexpected end of input", pos)
                        pos = self.char(pos + 1)
                        last += 1
                n_prev, shape = 1, [_TERMINAL] if last else []
                pos = self.space(pos + 1, nested)
            elif c in "<!":
                if c == "!":
                    pos += 1
                    if self.at(pos) != "<":
                        raise self.fail("expecting '<' after '!'", pos)
                pos = self.space(self.token(pos), nested)
                last, n_prev, shape = 1, 1, [_TERMINAL]
            elif c in _WORD:
                end = self.name(pos)
                ref = self.symbol(self.s[pos:end])
                self.referenced.setdefault(ref, self.s[pos:end])
                pos = self.space(end, nested)
                last, n_prev, shape = 1, 1, [ref]
            elif c == "(":
                pos, sub, made = self.group(pos, rule)
                last, n_prev, shape = 1, max(1, made), [sub]
                pos = self.space(pos, nested)
            elif c == ".":
                pos = self.space(pos + 1, nested)
                last, n_prev, shape = 1, 1, [_TERMINAL]
            elif c in "*+?{":
                lo, hi, pos = self.repetition(pos, nested)
                size, last, n_prev = self.repeat(size, last, n_prev, lo, hi, start)
                del items[len(items) - len(shape):]
                shape = self.repeat_shape(shape, lo, hi)
                items += shape
                continue
            else:
                break
            size += last
            items += shape
        return size, items, pos

    def group(self, pos: int, rule: str) -> tuple[int, int, int]:
        """Reads a parenthesised group; returns where it ends, its rule and how many rules it made."""
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.fail(f"groups nested deeper than {MAX_NESTING}", pos)
        before = len(self.symbols)
        sub = self.new_symbol(rule)
        pos = self.alternates(self.space(pos + 1, True), rule, sub, True)
        if self.at(pos) != ")":
            raise self.fail("expecting ')'", pos)
        self.depth -= 1
        return pos + 1, sub, len(self.symbols) - before

    def repetition(self, pos: int, nested: bool) -> tuple[int, int | None, int]:
        """Reads ``*``, ``+``, ``?`` or ``{m}``, ``{m,}``, ``{m,n}``; None is no upper bound."""
        c = self.s[pos]
        if c != "{":
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            return lo, hi, self.space(pos + 1, nested)
        pos = self.space(pos + 1, nested)
        if self.at(pos) not in _DIGITS or not self.at(pos):
            raise self.fail("expecting an integer", pos)
        end = self.integer(pos)
        lo = int(self.s[pos:end])
        pos = self.space(end, nested)
        hi: int | None = lo
        if self.at(pos) == ",":
            pos = self.space(pos + 1, nested)
            hi = None
            if self.at(pos) in _DIGITS and self.at(pos):
                end = self.integer(pos)
                hi = int(self.s[pos:end])
                pos = self.space(end, nested)
        if self.at(pos) != "}":
            raise self.fail("expecting '}'", pos)
        if lo > MAX_REPETITION:
            raise self.fail(f"a repetition count above {MAX_REPETITION}", pos)
        if hi is not None and hi > MAX_REPETITION:
            hi = None
        if hi is not None and hi < lo:
            raise self.fail("a repetition whose maximum is below its minimum", pos)
        return lo, hi, self.space(pos + 1, nested)

    def repeat(self, size: int, last: int, n_prev: int, lo: int, hi: int | None, pos: int) -> tuple[int, int, int]:
        """Accounts for llama.cpp's rewriting of ``S{lo,hi}``: lo copies of S, then hi - lo
        optional rules each holding a copy of S (one recursive rule when unbounded). Returns the
        sequence's new size, the size of what a further repetition would repeat, and llama.cpp's
        running product of repetitions."""
        if last == 0:
            raise self.fail("expecting an item before a repetition", pos)
        total = hi if hi is not None and hi > 0 else (lo if lo > 0 else 1)
        if n_prev * total >= MAX_REPETITION:
            raise self.fail("a repetition of repetitions too large for llama.cpp", pos)
        n_opt = 1 if hi is None else hi - lo
        self.grow(lo * last + n_opt * (last + 3), pos)
        repeated = lo * last + (1 if n_opt > 0 else 0)
        return size - last + repeated, repeated, n_prev * total

    def repeat_shape(self, shape: list[int], lo: int, hi: int | None) -> list[int]:
        """The rules llama.cpp writes for ``S{lo,hi}`` (``S' ::= S S' |`` when unbounded, else a
        chain of hi - lo optional rules); returns what replaces S in the sequence."""
        if hi is None:
            opt = self.new_symbol("rep")
            self.shapes[opt] = [shape + [opt], []]
            return shape * lo + [opt]
        prev: int | None = None
        for _ in range(hi - lo):
            opt = self.new_symbol("rep")
            self.shapes[opt] = [shape + ([prev] if prev is not None else []), []]
            prev = opt
        return shape * lo + ([prev] if prev is not None else [])

    def rule(self, pos: int) -> int:
        end = self.name(pos)
        name = self.s[pos:end]
        rule_id = self.symbol(name)
        pos = self.space(end, False)
        if self.s[pos:pos + 3] != "::=":
            raise self.fail("expecting '::='", pos)
        pos = self.alternates(self.space(pos + 3, True), name, rule_id, False)
        if self.at(pos) == "\r":
            pos += 2 if self.at(pos + 1) == "\n" else 1
        elif self.at(pos) == "\n":
            pos += 1
        elif pos < self.n:
            raise self.fail("expecting a newline or the end", pos)
        return self.space(pos, True)

    def parse(self) -> None:
        pos = self.space(0, True)
        if pos >= self.n:
            raise GrammarError("the grammar has no rules")
        while pos < self.n:
            pos = self.rule(pos)
        for sid, name in self.referenced.items():
            if sid not in self.shapes:
                raise GrammarError(f"undefined rule '{name}'")
        if "root" not in self.symbols:
            raise GrammarError("the grammar has no 'root' rule")
        _Ways(self).check()


class _Ways:
    """Counts, per rule, the ways llama.cpp's pushdown automaton can begin it: the stacks one step
    of it creates. A rule met again before anything is consumed is left recursion, which
    llama.cpp refuses as well."""

    def __init__(self, parser: _Parser) -> None:
        self.p = parser
        self.memo: dict[int, tuple[int, int]] = {}
        self.active: list[int] = []
        self.names = {sid: name for name, sid in parser.symbols.items()}

    def check(self) -> None:
        for rule_id in self.p.shapes:
            self.rule(rule_id)

    def rule(self, rule_id: int) -> tuple[int, int]:
        """(ways to begin with a terminal, at most MAX_WAYS + 1; 1 if it can derive nothing, else 0)."""
        if rule_id in self.memo:
            return self.memo[rule_id]
        name = self.names.get(rule_id, str(rule_id))
        if rule_id in self.active:
            raise GrammarError(f"left recursion through rule '{name}' (llama.cpp does not support it)")
        if len(self.active) >= MAX_NESTING:
            raise GrammarError(f"rules begin with other rules more than {MAX_NESTING} deep")
        self.active.append(rule_id)
        first = empty = 0
        for alt in self.p.shapes[rule_id]:
            f, e = self.sequence(alt)
            first, empty = first + f, empty + e
        self.active.pop()
        empty = min(empty, 1)  # every way of deriving nothing leaves the same stack: llama.cpp keeps one
        if first + empty > MAX_WAYS:
            raise GrammarError(f"rule '{name}' can begin in more than {MAX_WAYS} ways; llama.cpp would track "
                               "every one at once")
        self.memo[rule_id] = (first, empty)
        return first, empty

    def sequence(self, items: list[int]) -> tuple[int, int]:
        first, ways = 0, 1
        for item in items:
            if item == _TERMINAL:
                return min(first + ways, MAX_WAYS + 1), 0
            f, e = self.rule(item)
            first, ways = min(first + ways * f, MAX_WAYS + 1), min(ways * e, MAX_WAYS + 1)
            if ways == 0:
                break
        return first, ways


def check_gbnf(text: str, max_chars: int = MAX_GRAMMAR_CHARS) -> None:
    """Raises GrammarError unless ``text`` is GBNF that llama.cpp can safely be given."""
    if len(text) > max_chars:
        raise GrammarError(f"the grammar has {len(text)} characters; at most {max_chars} are accepted")
    if "\x00" in text:
        raise GrammarError("the grammar contains a NUL character")
    if any("\ud800" <= c <= "\udfff" for c in text):
        raise GrammarError("the grammar contains a lone UTF-16 surrogate")
    _Parser(text).parse()


@functools.cache
def _converter() -> ModuleType:
    """llama-cpp-python's JSON-schema converter, loaded from its file alone: importing it as
    ``llama_cpp.llama_grammar`` would run the package's ``__init__`` and load libllama, which the
    coordinator does not have and the engine loads in its own order. The module needs only the
    standard library."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise GrammarError("JSON schemas need llama-cpp-python, which is not installed here")
    path = f"{list(spec.submodule_search_locations)[0]}/llama_grammar.py"
    mod_spec = importlib.util.spec_from_file_location("hydrad_llama_grammar", path)
    if mod_spec is None or mod_spec.loader is None:
        raise GrammarError("JSON schemas need llama-cpp-python's llama_grammar module")
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def json_object_grammar() -> str:
    """Any JSON object: OpenAI's ``response_format: {"type": "json_object"}``. Made from a schema
    rather than llama-cpp-python's JSON_GBNF, whose unbounded whitespace rule lets a small model
    emit newlines until ``max_tokens``; the converter's allows a few."""
    return schema_grammar({"type": "object"})


def schema_grammar(schema: Any, max_chars: int = MAX_GRAMMAR_CHARS) -> str:
    """The GBNF for a JSON schema (an object), as llama-server makes it; GrammarError otherwise.
    ``max_chars`` bounds the schema as JSON and the grammar (:data:`MAX_TOOLS_GRAMMAR_CHARS` for tools)."""
    return _schema_gbnf(schema, "", max_chars=max_chars)


def check_schema(schema: Any) -> None:
    """GrammarError unless ``schema`` is within the bounds and converts to a grammar: what a tool's
    parameters must pass at the door. Its grammar is not checked on its own: the one grammar made
    of every offered tool is, where the engine makes it (checking each tool's as well doubled the
    time 128 tools took to prepare)."""
    _schema_gbnf(schema, "", check=False)


def framed_schema_grammar(schema: Any, opening: str, closing: str, many: bool,
                          max_chars: int = MAX_GRAMMAR_CHARS) -> str:
    """The GBNF for JSON matching ``schema`` between two literals (a tool call's tags), once or,
    with ``many``, one or more times. The schema's rules are made under their own name and the
    root frames them, so nothing of the converter's text is rewritten."""
    rules = _schema_gbnf(schema, "framed", check=False, max_chars=max_chars)
    one = f"{_literal(opening)} framed {_literal(closing)}"
    gbnf = f"{rules}\nroot ::= {'(' + one + ' space)+' if many else one}"
    try:
        check_gbnf(gbnf, max_chars)
    except GrammarError as exc:
        raise GrammarError(f"the grammar made from the schema is not usable: {exc}") from None
    return gbnf


def _literal(text: str) -> str:
    """A GBNF literal: its escapes (``\\n``, ``\\"``, ``\\uXXXX``) are JSON's."""
    return json.dumps(text, ensure_ascii=False)


def _schema_gbnf(schema: Any, name: str, check: bool = True, max_chars: int = MAX_GRAMMAR_CHARS) -> str:
    if not isinstance(schema, dict):
        raise GrammarError("a JSON schema must be an object")
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    most = max(MAX_SCHEMA_CHARS, max_chars)
    if len(text) > most:
        raise GrammarError(f"the schema has {len(text)} characters as JSON; at most {most} are accepted")
    key = (text, name, check, max_chars)
    with _MADE_LOCK:
        made = _MADE.get(key)
        if made is not None:
            _MADE.move_to_end(key)
            return made
    gbnf = _schema_text_gbnf(text, name, check, max_chars)
    with _MADE_LOCK:
        global _made_chars
        if key not in _MADE:
            _MADE[key] = gbnf
            _made_chars += len(text) + len(gbnf)
        while _made_chars > MADE_CHARS and _MADE:
            (old_text, *_), old = _MADE.popitem(last=False)
            _made_chars -= len(old_text) + len(old)
    return gbnf


MADE_CHARS = 16 << 20
"""Characters of schemas and their grammars remembered (least recently used go first): an agent
sends the same tools with every turn, and each turn would otherwise convert and check each of
them again. A refusal is not remembered: it costs little, since the bounds come first."""
_MADE: "OrderedDict[tuple[str, str, bool, int], str]" = OrderedDict()
_made_chars = 0
_MADE_LOCK = threading.Lock()


def _schema_text_gbnf(text: str, name: str, check: bool, max_chars: int) -> str:
    """The grammar of a schema given as compact JSON (the text is what it is remembered by)."""
    schema = json.loads(text)
    try:
        schemashape.check(schema)
    except schemashape.SchemaInvalid as exc:
        raise GrammarError(f"the schema cannot be used: {exc}") from None
    try:
        schemabounds.check(schema, max_chars, MAX_WAYS)
    except SchemaTooCostly as exc:
        raise GrammarError(str(exc)) from None
    try:
        gbnf = _convert(text, name)
    except GrammarError:
        raise
    except RecursionError:
        raise GrammarError("the schema nests too deeply to convert") from None
    except Exception as exc:  # the converter raises what it meets: KeyError, ValueError, TypeError ...
        raise GrammarError(f"the schema cannot be converted to a grammar ({type(exc).__name__}: {exc})"[:500]) from None
    if not check:
        return gbnf
    try:
        check_gbnf(gbnf, max_chars)
    except GrammarError as exc:
        raise GrammarError(f"the grammar made from the schema is not usable: {exc}") from None
    return gbnf


def _convert(text: str, name: str) -> str:
    """The converter's grammar for a schema (JSON text) whose top rule is ``name`` (``""``: root),
    as its ``json_schema_to_gbnf`` makes it. Its ``$ref`` targets are found here rather than by the
    converter's own ``resolve_refs``, which takes no ``"#"`` (the whole schema) and never looks
    inside a node that has a ``$ref`` itself, so a recursive schema failed with "Unsupported ref"
    or a KeyError; its ``visit`` handles recursion (a rule that names itself) as llama.cpp does."""
    module = _converter()
    converter = module.SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    schema = json.loads(text)
    converter._refs.update(_local_refs(schema))
    converter.visit(schema, name)
    return str(converter.format_grammar())


_WHOLE = "#/whole-schema"


def _local_refs(schema: Any) -> dict[str, Any]:
    """Every ``$ref`` in ``schema`` → the part of it it names (``#`` or a JSON pointer ``#/a/b``);
    GrammarError for one that points elsewhere or at nothing."""
    out: dict[str, Any] = {}
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if ref == "#":  # the whole schema: named so its rule gets a name of its own (the converter names a
            ref = node["$ref"] = _WHOLE  # rule after the last part of the reference, and "#" is not a name)
            out[ref] = schema
        if ref is not None and ref not in out:
            if not isinstance(ref, str) or not ref.startswith("#/"):
                raise GrammarError(f"$ref {str(ref)[:100]!r}: only references inside the schema ('#', '#/...') "
                                   "are supported")
            target = schema
            for part in ref[2:].split("/"):
                key = part.replace("~1", "/").replace("~0", "~")
                if isinstance(target, list) and key.isdigit() and int(key) < len(target):
                    target = target[int(key)]
                elif isinstance(target, dict) and key in target:
                    target = target[key]
                else:
                    raise GrammarError(f"$ref {ref[:100]!r} names nothing in the schema")
            if not isinstance(target, dict):
                raise GrammarError(f"$ref {ref[:100]!r} names a value that is not a schema")
            out[ref] = target
        stack.extend(node.values())
    return out
