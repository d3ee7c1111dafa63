"""One request path: every dialect's answer is built by its renderer (``hydrad.wire.render``) from the
one event stream, on both doors, and nowhere else.

The renderers are listed, and every string literal of the code outside ``hydrad/wire/render`` is
read: one that spells an answer's shape (an OpenAI object name, an Anthropic event, a llama-server
answer field, the end of a stream) means a module builds an answer itself, and fails the test.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from hydrad.wire.render import RENDERERS, Renderer

REPO = Path(__file__).resolve().parents[2]
RENDER = REPO / "hydrad" / "wire" / "render"

SHAPES = ("chat.completion", "text_completion", "message_start", "content_block_start", "content_block_delta",
          "content_block_stop", "message_delta", "message_stop", "input_json_delta", "stop_type", "stopping_word",
          "tokens_predicted", "tokens_evaluated", "completion_probabilities", "generation_settings",
          "prompt_progress", "[DONE]", "system_fingerprint")
"""What only an answer contains: seen in a string literal elsewhere, someone builds one by hand."""

DIALECTS = {"openai.chat", "openai.completion", "openai.responses", "anthropic.messages", "llama.completion"}


def _literals(path: Path) -> list[tuple[int, str]]:
    """Every string constant of ``path`` that is not a docstring."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value if isinstance(node.value, str) else node.value.decode("latin-1"))
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and id(node) not in docs]


def _shapes(text: str) -> list[str]:
    """The answer shapes ``text`` is (a key or an object name as a literal of its own), or holds (the
    end of a stream)."""
    return [s for s in SHAPES if text == s or (s == "[DONE]" and s in text)]


def test_one_renderer_per_dialect() -> None:
    assert set(RENDERERS) == DIALECTS
    for name, cls in RENDERERS.items():
        assert issubclass(cls, Renderer) and cls.dialect == name
        for method in ("piece", "end", "broken", "whole"):  # what every answer needs, each its own
            assert getattr(cls, method) is not getattr(Renderer, method), f"{name} does not render {method}"
        assert inspect.getmodule(cls).__name__.startswith("hydrad.wire.render.")


def test_no_answer_is_built_outside_the_renderers() -> None:
    found = []
    for path in sorted((REPO / "hydrad").rglob("*.py")):
        if RENDER in path.parents:
            continue
        for line, text in _literals(path):
            hits = _shapes(text)
            if hits:
                found.append(f"{path.relative_to(REPO)}:{line}: {hits} in {text[:60]!r}")
    assert found == [], "answers built outside hydrad/wire/render:\n" + "\n".join(found)


def test_the_check_sees_what_it_looks_for() -> None:
    """The scan finds the shapes where they are (the renderers), so an empty result above means something."""
    seen = {s for path in RENDER.glob("*.py") for _, text in _literals(path) for s in _shapes(text)}
    assert seen == set(SHAPES)


def test_both_doors_drive_answers_the_same_way() -> None:
    """The only code that runs a renderer over events is the shared driver, called by the two doors."""
    callers = sorted(str(p.relative_to(REPO)) for p in (REPO / "hydrad").rglob("*.py")
                     if "answering.stream(" in p.read_text() or "answering.whole(" in p.read_text())
    assert callers == ["hydrad/coordinator/frontdoor.py", "hydrad/engine/http/generation.py"]
