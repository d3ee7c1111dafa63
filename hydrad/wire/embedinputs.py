"""The shapes an embedding request's input may take, as llama-server reads them.

One input is a string, a list of token ids, a list mixing token ids and text (its text pieces are
tokenized where they stand, the first one with the model's BOS, and joined with the ids: llama-server's
mixed prompt), or an object: ``{"prompt_string": text}`` or ``{"content": [{"type": "text", "text":
...}, ...]}`` (the text parts joined). A request's input is one of those or a list of them; a list is
one input when it holds a token id and only ids and strings, and several inputs otherwise. Images,
audio and video are refused (no embedding model here takes them), and so is ``{"content": "text"}``,
as llama-server refuses it. Every check is on the parsed body, before anything is tokenized: the
token ids and text pieces of all inputs together are bounded by :data:`MAX_TOTAL_TOKENS`, and their
text by :data:`CHARS_PER_TOKEN` characters a token, so no request makes more tokenizing than its
answer could hold. :func:`check_token_counts` is the check after tokenizing, for embeddings and
reranking alike.
"""

from __future__ import annotations

from typing import Any

from hydrad.wire.openai import INT32_MAX, ApiError

MAX_INPUTS = 2048
"""Most inputs in one request (OpenAI's own limit)."""
MAX_TOTAL_TOKENS = 65536
"""Most tokens of all inputs of one request together: about 128 embedding decodes of 512 tokens."""
CHARS_PER_TOKEN = 64
"""The characters a token is taken to hold at most, to bound texts before they are tokenized."""

Input = str | list[int | str]
"""A checked input: text, or token ids with text pieces among them (all ids: a token-id input)."""

_OBJECT_MEMBERS = {"prompt_string", "content", "multimodal_data"}


def _is_id(value: Any) -> bool:
    return type(value) is int and 0 <= value <= INT32_MAX


def _one_mixed(value: Any) -> bool:
    """A list that is one input: a token id in it, and nothing but ids and strings."""
    return isinstance(value, list) and any(type(t) is int for t in value) and \
        all(type(t) is int or isinstance(t, str) for t in value)


def inputs(value: Any, name: str, n_vocab: int | None) -> list[Input]:
    """The inputs of a request's ``name`` field, checked; ApiError 400 naming the field otherwise."""
    if isinstance(value, (str, dict)) or _one_mixed(value):
        items: list[Any] = [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise ApiError(400, f"{name} must be a string, token ids, an object of text, or a non-empty list of those",
                       "invalid_field", name)
    if len(items) > MAX_INPUTS:
        raise ApiError(400, f"{name}: at most {MAX_INPUTS} inputs per request (got {len(items)})", "invalid_field", name)
    out = [_one(item, name if item is value else f"{name}[{i}]", name, n_vocab) for i, item in enumerate(items)]
    pieces = sum(len(x) for x in out if isinstance(x, list))
    chars = sum(len(x) for x in out if isinstance(x, str)) + \
        sum(len(t) for x in out if isinstance(x, list) for t in x if isinstance(t, str))
    if pieces > MAX_TOTAL_TOKENS or chars > MAX_TOTAL_TOKENS * CHARS_PER_TOKEN:
        raise ApiError(400, f"{name}: {pieces} token ids and text pieces and {chars} characters in all; at most "
                       f"{MAX_TOTAL_TOKENS} tokens per request", "input_too_long", name)
    return out


def check_token_counts(name: str, tokens: list[list[int]], max_tokens: int, does: str = "embeds",
                       per: str = "input", subject: str = "{where}") -> None:
    """Each tokenized prompt has tokens and at most ``max_tokens`` (the embedding context's n_ubatch),
    all of them at most MAX_TOTAL_TOKENS; ApiError 400 naming ``name`` otherwise. ``subject`` words
    the prompt (``{where}`` is ``name[i]``), ``does`` and ``per`` what the engine does with it."""
    for i, t in enumerate(tokens):
        where = subject.format(where=f"{name}[{i}]")
        if not t:
            raise ApiError(400, f"{where} has no tokens", "invalid_field", name)
        if len(t) > max_tokens:
            raise ApiError(400, f"{where} has {len(t)} tokens; this engine {does} at most {max_tokens} tokens per "
                           f"{per} (its n_ubatch; raise it to take longer {per}s)", "input_too_long", name,
                           details={"n_prompt_tokens": len(t), "n_ubatch": max_tokens})
    total = sum(len(t) for t in tokens)
    if total > MAX_TOTAL_TOKENS:
        raise ApiError(400, f"{name}: {total} tokens in all; at most {MAX_TOTAL_TOKENS} per request", "input_too_long",
                       name)


def _one(item: Any, where: str, name: str, n_vocab: int | None) -> Input:
    if isinstance(item, str):
        if not item:
            raise ApiError(400, f"{where} is empty", "invalid_field", name)
        return item
    if isinstance(item, dict):
        return _object(item, where, name)
    if not isinstance(item, list) or not item or not all(type(t) is int or isinstance(t, str) for t in item):
        raise ApiError(400, f"{where} must be a non-empty string, a non-empty list of token ids and text, or an "
                       "object of text", "invalid_field", name)
    for t in item:
        if isinstance(t, str):
            continue
        if not _is_id(t):
            raise ApiError(400, f"{where}: token ids must be non-negative integers", "invalid_field", name)
        if n_vocab is not None and t >= n_vocab:
            raise ApiError(400, f"{where}: token {t} is not in this model's vocabulary (0..{n_vocab - 1})",
                           "invalid_field", name)
    return list(item)


def _object(item: dict[str, Any], where: str, name: str) -> str:
    """``{"prompt_string": text}`` or ``{"content": [text parts]}``: the text."""
    extra = sorted(set(item) - _OBJECT_MEMBERS)
    if extra:
        raise ApiError(400, f"{where}: unknown member {extra[0]!r} (prompt_string or content)", "invalid_field", name)
    if item.get("multimodal_data"):
        raise ApiError(400, f"{where}: this engine embeds text only (multimodal_data)", "invalid_field", name)
    if "prompt_string" in item:
        text = item["prompt_string"]
        if not isinstance(text, str) or not text:
            raise ApiError(400, f"{where}.prompt_string must be a non-empty string", "invalid_field", name)
        return text
    parts = item.get("content")
    if not isinstance(parts, list) or not parts:
        raise ApiError(400, f"{where}.content must be a non-empty list of text parts ({{\"type\": \"text\", "
                       "\"text\": ...}})", "invalid_field", name)
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else None
            why = "this engine embeds text only" if kind in ("image_url", "input_audio", "input_video") else \
                'each part must be {"type": "text", "text": ...}'
            raise ApiError(400, f"{where}.content[{j}]: {why}", "invalid_field", name)
        texts.append(part["text"])
    text = "".join(texts)
    if not text:
        raise ApiError(400, f"{where}.content has no text", "invalid_field", name)
    return text
