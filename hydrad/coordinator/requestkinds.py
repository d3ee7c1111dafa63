"""What the front door knows of a parsed request besides its body: how its dialect answers it
(:class:`Answer`, one factory per dialect, each naming its renderer) and what was measured of it
where it was parsed (:class:`Outcome`: the metrics' labels, routing's estimates)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from hydrad.coordinator.affinity import prefix_of
from hydrad.wire import anthropic
from hydrad.wire.render import ChatAnswer, CompletionAnswer, MessagesAnswer, NativeAnswer, Renderer, ResponsesAnswer
from hydrad.wire.render import anthropic as anthropic_render
from hydrad.wire.render import responses as responses_render
from hydrad.wire.render.openai import new_id
from hydrad.wire.openai import ApiError
from hydrad.wire.requests import GenRequest

_P = TypeVar("_P", bound=tuple)  # type: ignore[type-arg]


def _estimate_tokens(gen: GenRequest) -> int:
    """The coordinator has no tokenizer: about 4 characters per token, plus a few per chat message
    (and the tools, which the prompt lists)."""
    if gen.messages is not None:
        tools = len(json.dumps(gen.tools.tools)) if gen.tools is not None else 0
        return (sum(len(m.get("content") or "") + len(m.get("tool_calls") or "") for m in gen.messages) + tools) // 4 \
            + 4 * len(gen.messages)
    return len(gen.prompt or "") // 4 + 1


@dataclass(frozen=True)
class Answer:
    """How a parsed request is answered: its renderer (made once the engine is chosen: the model and
    generation it serves go into the answer), whether it streams, and its id for the logs."""

    rid: str
    streamed: bool
    renderer: Callable[..., Renderer]
    """``renderer(model, fingerprint)``; for a request of several choices also the choice's index."""
    choices: int = 1  # OpenAI's n


def openai_answer(cls: type[ChatAnswer] | type[CompletionAnswer]) -> Callable[[Any, GenRequest], Answer]:
    def answer(req: Any, greq: GenRequest) -> Answer:
        rid = new_id(cls.kind)
        return Answer(rid, req.stream, lambda model, fp, index=0: cls(
            model, fp, include_usage=req.include_usage(), logprobs=greq.logprobs is not None, rid=rid, index=index,
            post=greq.post_sampling_probs),
            req.n)
    return answer


def messages_answer(req: Any, greq: GenRequest) -> Answer:
    rid = anthropic_render.new_id()
    return Answer(rid, req.stream, lambda model, _fp: MessagesAnswer(model, tools=greq.tools is not None,
                                                                      thinking=anthropic.thinks(req), rid=rid))


def responses_answer(req: Any, greq: GenRequest) -> Answer:
    rid = responses_render.new_id()
    return Answer(rid, req.stream, lambda model, _fp: ResponsesAnswer(model, req.echo(), rid=rid))


def native_answer(req: Any, greq: GenRequest) -> Answer:
    greq.report_settings = True  # llama-server's answer says what the request ran with
    return Answer(new_id("completion"), req.stream, lambda model, _fp: NativeAnswer(req, model))


def estimates(greq: GenRequest) -> tuple[int, str | None]:
    """A request's estimated prompt tokens and conversation prefix hash (routing's inputs that grow
    with the request: 40,000 messages took 49 ms)."""
    return _estimate_tokens(greq), prefix_of(greq.messages)


class Outcome:
    """What is known of a request besides its body: what the metrics need once it is answered, and
    routing's estimates, made on the preparation worker that parsed it rather than on the loop."""

    __slots__ = ("t0", "model", "defaulted", "engine", "estimates", "session")

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.session: str | None = None  # the session id as the client gave it (echoed in X-Session-Id)
        self.model: str | None = None
        self.defaulted = False  # default_model serves it (X-Hydra-Default-Model)
        self.engine: str | None = None
        self.estimates: tuple[int, str | None] | None = None

    def measured(self, parsed: _P) -> _P:
        """``parsed`` (a request and its GenRequest), its estimates kept (where it was parsed)."""
        self.estimates = estimates(parsed[1])
        return parsed


MAX_SESSION_ID = 256
# A session id travels back in the X-Session-Id header and into logs and events: printable ASCII
# only (no control characters, nothing a header cannot carry), no leading or trailing space.
_SESSION_RE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")  # fullmatch: "$" would let a trailing newline through


def session_id_of(req: Any, request: Any) -> str | None:
    """The request's session id (body ``session_id``, else header ``X-Session-Id``), or None.

    It is echoed in a response header and written to logs and events, so it must be printable
    ASCII (a header decoded as Latin-1 that held UTF-8 shows up here as non-ASCII, a newline
    would split a header or a log line): anything else is a 400, not a broken response.
    """
    own = getattr(req, "session_id", None)  # a field of Anthropic's request, an extra of the others
    value = own if own is not None else (req.model_extra or {}).get("session_id")
    if value is None:
        value = request.headers.get("x-session-id")
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > MAX_SESSION_ID or not _SESSION_RE.fullmatch(value):
        raise ApiError(400, f"session_id must be a string of 1 to {MAX_SESSION_ID} printable ASCII characters "
                       "(no control characters, no leading or trailing space)", "invalid_field", "session_id")
    return value
