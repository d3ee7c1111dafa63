"""Every answer a client gets is built here: one renderer per dialect, each reading the one event
stream of a request (:mod:`hydrad.wire.events`) the same way on both doors. The engine's door feeds
it the engine thread's events; the front door feeds it the same events decoded from the bus. The
drive (stream or whole, batching writes, the end of a broken stream) is
:mod:`hydrad.wire.answering`'s, also shared.

``RENDERERS`` lists them; a test fails when any other module builds an answer's shape.
"""

from __future__ import annotations

from hydrad.wire.render.anthropic import MessagesAnswer
from hydrad.wire.render.base import Renderer
from hydrad.wire.render.native import NativeAnswer
from hydrad.wire.render.openai import ChatAnswer, CompletionAnswer
from hydrad.wire.render.responses import ResponsesAnswer

RENDERERS: dict[str, type[Renderer]] = {cls.dialect: cls for cls in (
    ChatAnswer, CompletionAnswer, MessagesAnswer, NativeAnswer, ResponsesAnswer)}

__all__ = ["RENDERERS", "ChatAnswer", "CompletionAnswer", "MessagesAnswer", "NativeAnswer", "Renderer",
           "ResponsesAnswer"]
