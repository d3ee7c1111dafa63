"""The bounds on a chat template's extra variables, at a request's door and in the engine's
``default_template_kwargs`` alike."""

from __future__ import annotations

from typing import Any

import pytest

from hydrad.common import templatekwargs
from hydrad.common.params import RuntimeParams, check_partial


def test_a_templates_switches_pass() -> None:
    kw = {"enable_thinking": False, "reasoning_effort": "high", "nested": {"a": [1, 2.5, None, "x"]}}
    assert templatekwargs.check(kw) is kw


@pytest.mark.parametrize("kwargs, words", [
    ([("a", 1)], "object"),
    ({"messages": []}, "engine itself"),
    ({"add_generation_prompt": False}, "engine itself"),
    ({"bos_token": ""}, "engine itself"),
    ({"": 1}, "not a template variable name"),
    ({"9lives": 1}, "not a template variable name"),
    ({"a-b": 1}, "not a template variable name"),
    ({"x" * 65: 1}, "not a template variable name"),
    ({f"k{i}": i for i in range(templatekwargs.MAX_KWARGS + 1)}, "at most"),
    ({"big": "x" * templatekwargs.MAX_KWARGS_BYTES}, "bytes"),
    ({"nan": float("nan")}, "JSON"),
    ({"obj": object()}, "JSON"),
])
def test_what_a_template_may_not_be_given(kwargs: Any, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        templatekwargs.check(kwargs)


def test_the_engine_default_is_checked_the_same_way() -> None:
    assert RuntimeParams(default_template_kwargs={"enable_thinking": False}).default_template_kwargs == {
        "enable_thinking": False}
    assert RuntimeParams(default_template_kwargs={}).default_template_kwargs == {}
    with pytest.raises(ValueError, match="default_template_kwargs"):
        check_partial({"default_template_kwargs": {"tools": []}})
    with pytest.raises(ValueError, match="reasoning_format"):
        check_partial({"reasoning_format": "markdown"})
    with pytest.raises(ValueError, match="reasoning_budget"):
        check_partial({"reasoning_budget": -2})
