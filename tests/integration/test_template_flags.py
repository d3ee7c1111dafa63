"""A chat template rendered as llama-server renders it, on hydrad started with llama-server's command
line and the real model: ``--reasoning on|off|auto`` decides the template's ``enable_thinking``
(a request's ``chat_template_kwargs`` still wins), the template is given today's date
(``date_string``, ``datetime``, ``strftime_now``), an undefined variable added to text is empty, and
``/apply-template`` leaves the assistant's turn closed when ``add_generation_prompt`` is false."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support.engine import REPO, Engine, free_port

# A thinking template that writes the date three ways and adds a variable no one defines (as
# FireFunction's template adds ``functions``); it opens the think block and closes it at once
# unless the chat may think.
TEMPLATE = """{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
Today: {{ date_string }} / {{ datetime }} / {{ strftime_now("%Y-%m-%d") }}{{ "" + undefined_suffix }}
<think>
{%- if not enable_thinking %}</think>{% endif %}
{%- endif %}"""

CHAT = {"messages": [{"role": "user", "content": "What is today?"}]}


def _engine(tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine], name: str,
            *more: str) -> Engine:
    template = tmp_path / f"{name}.jinja"
    template.write_text(TEMPLATE)
    port = free_port()
    e = start_engine(name=name, port=port, flags=[
        "-m", str(smollm_path), "--port", str(port), "-c", "1024", "-np", "1", "-t", "1", "--jinja",
        "--chat-template-file", str(template), *more])
    e.wait_ready(120)
    return e


def _prompt(e: Engine, **body: Any) -> str:
    r = e.http.post("/apply-template", json={**CHAT, **body})
    assert r.status_code == 200, r.text
    return str(r.json()["prompt"])


def _today() -> set[tuple[str, str, str]]:
    now = datetime.datetime.now()
    return {(d.strftime("%d %b %Y"), d.strftime("%b %d %Y"), d.strftime("%Y-%m-%d"))
            for d in (now, now - datetime.timedelta(minutes=5))}


@pytest.mark.model
def test_reasoning_off_closes_the_think_block_and_a_request_may_open_it(
        tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine]) -> None:
    e = _engine(tmp_path, smollm_path, start_engine, "off", "--reasoning", "off")
    prompt = _prompt(e)
    assert prompt.endswith("<think></think>"), prompt
    assert any(f"Today: {a} / {b} / {c}\n" in prompt for a, b, c in _today()), prompt
    # the request's own kwargs win over the command line's
    assert _prompt(e, chat_template_kwargs={"enable_thinking": True}).endswith("<think>")
    # no generation prompt: the chat ends with the user's turn, nothing of the assistant's
    closed = _prompt(e, add_generation_prompt=False)
    assert closed.endswith("What is today?<|im_end|>\n") and "assistant" not in closed, closed
    bad = e.http.post("/apply-template", json={**CHAT, "add_generation_prompt": "no"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "add_generation_prompt", bad.text
    # a chat completion is made from the same prompt
    r = e.http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(
        e.http.post("/tokenize", json={"content": prompt, "parse_special": True}).json()["tokens"])


@pytest.mark.model
@pytest.mark.parametrize("flag", [[], ["--reasoning", "auto"], ["-rea", "on"]])
def test_reasoning_auto_or_on_leaves_the_think_block_open(
        tmp_path: Path, smollm_path: Path, start_engine: Callable[..., Engine], flag: list[str]) -> None:
    e = _engine(tmp_path, smollm_path, start_engine, "think", *flag)
    assert _prompt(e).endswith("<think>")
    assert _prompt(e, chat_template_kwargs={"enable_thinking": False}).endswith("<think></think>")


def test_an_unknown_reasoning_value_is_refused_by_name(smollm_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "hydrad.cli.hydrad", "-m", str(smollm_path), "--reasoning", "maybe"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--reasoning" in r.stderr and "maybe" in r.stderr, r.stderr
