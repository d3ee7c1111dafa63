"""Operator jinja templates render in worker processes under a time, a memory and an output limit: a
template that loops for ever, builds a gigabyte or writes without end fails its render with a clear
error, and the next render is served. Real worker processes."""

from __future__ import annotations

import threading
import time

import pytest

from hydrad.engine.jinja import TemplateFailed, render as render_here
from hydrad.engine.jinjabox import JinjaBox, TemplateLimits

MESSAGES = [{"role": "user", "content": "What is the weather?"}]
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
GOOD = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}<|im_start|>assistant\n")


@pytest.fixture
def box() -> JinjaBox:
    b = JinjaBox(TemplateLimits(render_timeout_s=1.5, render_memory_bytes=256 << 20, max_output_chars=1 << 20))
    yield b
    b.close()


def test_a_template_renders_as_in_process(box: JinjaBox) -> None:
    assert box.render(GOOD, MESSAGES, TOOLS, "<s>", "</s>") == render_here(GOOD, MESSAGES, TOOLS, "<s>", "</s>")


def test_a_template_that_loops_for_ever_is_stopped(box: JinjaBox) -> None:
    forever = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    t0 = time.monotonic()
    with pytest.raises(TemplateFailed, match=r"took longer than 1.5 s to render \(render_timeout_s\)"):
        box.render(forever, MESSAGES, None, "", "")
    assert time.monotonic() - t0 < 4.0
    assert box.render(GOOD, MESSAGES, None, "", "").endswith("<|im_start|>assistant")  # a new worker serves the next


def test_a_gigabyte_string_is_stopped(box: JinjaBox) -> None:
    with pytest.raises(TemplateFailed, match=r"needed more than 256 MiB to render \(render_memory_bytes\)"):
        box.render("{{ 'x' * 1000000000 }}", MESSAGES, None, "", "")
    assert box.render(GOOD, MESSAGES, None, "", "").endswith("<|im_start|>assistant")


def test_output_past_the_limit_is_stopped_as_it_is_written(box: JinjaBox) -> None:
    flood = "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"  # 100 MB, a kilobyte at a time
    t0 = time.monotonic()
    with pytest.raises(TemplateFailed, match=r"wrote more than 1048576 characters \(max_output_chars\)"):
        box.render(flood, MESSAGES, None, "", "")
    assert time.monotonic() - t0 < 1.5


def test_a_template_error_is_the_templates(box: JinjaBox) -> None:
    with pytest.raises(TemplateFailed, match="refused the messages: no tools here"):
        box.render("{{ raise_exception('no tools here') }}", MESSAGES, None, "", "")
    with pytest.raises(TemplateFailed, match="the chat template failed"):
        box.render("{% for %}", MESSAGES, None, "", "")


def test_renders_from_many_threads(box: JinjaBox) -> None:
    out: list[str] = []
    threads = [threading.Thread(target=lambda: out.append(box.render(GOOD, MESSAGES, TOOLS, "", ""))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(out) == 6 and len(set(out)) == 1
