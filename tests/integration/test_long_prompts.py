"""Long prompts with many special tokens are tokenized in pieces by the real tokenizers of both
models: the same tokens llama.cpp makes in one call, in linear rather than quadratic time."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from hydrad.common.params import RuntimeParams
from hydrad.engine import llama

WORDS = ("the quick brown fox jumps over lazy code def return  \n\n  spaces tabs\t <b>html</b> émoji 🙂 "
         "[INST] <|im_start|> <start_of_turn> <end_of_turn> <|im_end|>").split(" ")


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_pieces_give_the_same_tokens_as_one_call(which: str, smollm_path: Path, gemma_path: Path) -> None:
    m = llama.Model.load(smollm_path if which == "smollm" else gemma_path, RuntimeParams(model="x", n_gpu_layers=0))
    try:
        rng = random.Random(7)
        for n, empty in ((3000, True), (1500, False)):
            msgs = [{"role": ("user", "assistant")[i % 2],
                     "content": "" if empty else " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 24)))}
                    for i in range(n)]
            text = m.apply_chat_template(msgs, None)
            t0 = time.perf_counter()
            whole = m.tokenize(text, True, True)
            t1 = time.perf_counter()
            pieces = m.tokenize_prompt(text)
            t2 = time.perf_counter()
            assert pieces == whole, (which, n, empty)
            marker = m.specials().marker
            assert marker is not None  # the model's prompts were cut, not tokenized whole
            assert t2 - t1 < t1 - t0, (which, n, t1 - t0, t2 - t1)
            raw = m.tokenize_prompt(text.replace(marker.text, marker.text.upper()))  # nothing to cut at
            assert raw == m.tokenize(text.replace(marker.text, marker.text.upper()), True, True)
    finally:
        m.free()


@pytest.mark.serial  # the refusal timed under 2 s
def test_forty_thousand_messages_are_refused_before_they_are_tokenized(smollm_path: Path) -> None:
    m = llama.Model.load(smollm_path, RuntimeParams(model="x", n_gpu_layers=0))
    try:
        t0 = time.perf_counter()
        with pytest.raises(llama.PromptTextTooLong) as err:
            m.chat_tokens([{"role": "user", "content": ""}] * 40_000, max_chars=4096 * 64)
        assert err.value.chars > 1_000_000 and time.perf_counter() - t0 < 2.0
    finally:
        m.free()


def test_a_template_llama_cpp_does_not_know_leaves_long_prompts_whole(smollm_path: Path) -> None:
    """The cut is found from the model's template as llama.cpp formats it; a template it does not
    know (an operator's own jinja) means no cut, never a failed completion."""
    m = llama.Model.load(smollm_path, RuntimeParams(model="x", n_gpu_layers=0))
    try:
        m.chat_template = b"{% for m in messages %}{{ m['content'] }}{% endfor %}"
        text = "<|im_start|>user\nhello<|im_end|>\n" * 1000
        assert m.tokenize_prompt(text) == m.tokenize(text, True, True)
        assert m.specials().marker is None
    finally:
        m.free()
