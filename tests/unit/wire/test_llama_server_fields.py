"""The silent-drop list is empty: every request field llama-server documents for ``POST /completion``
is honoured by hydrad's native door, refused by name when set to anything but llama-server's default,
or inert here (it only acts together with a field that is refused), and each class is checked against
the real parser.

The list is the option list of ``POST /completion`` in the ``tools/server/README.md`` of the
llama.cpp that llama-cpp-python 0.3.36 vendors (the build hydrad runs on), in its order."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hydrad.wire import native_completion
from hydrad.wire.openai import ApiError

DOCUMENTED = (
    "prompt temperature dynatemp_range dynatemp_exponent top_k top_p min_p n_predict n_indent n_keep n_cmpl "
    "n_cache_reuse stream stop typical_p repeat_penalty repeat_last_n presence_penalty frequency_penalty "
    "dry_multiplier dry_base dry_allowed_length dry_penalty_last_n dry_sequence_breakers xtc_probability "
    "xtc_threshold mirostat mirostat_tau mirostat_eta grammar json_schema seed ignore_eos logit_bias n_probs "
    "min_keep t_max_predict_ms id_slot cache_prompt return_tokens samplers timings_per_token return_progress "
    "sse_ping_interval post_sampling_probs response_fields lora"
).split()

# honoured: a value other than the default changes what is generated or returned, as in llama-server
HONOURED: dict[str, Any] = {
    "prompt": "Hello", "temperature": 0.5, "top_k": 5, "top_p": 0.9, "min_p": 0.1, "n_predict": 8, "stream": True,
    "stop": ["x"], "repeat_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5,
    "grammar": 'root ::= "a"', "json_schema": {"type": "object"}, "seed": 3, "ignore_eos": True, "n_probs": 3,
    "id_slot": 0, "cache_prompt": False, "return_tokens": True, "return_progress": True,
    "n_keep": 16, "n_cache_reuse": 256, "logit_bias": [[15, -1.0]], "lora": [{"id": 0, "scale": 0.5}],
    "timings_per_token": True, "post_sampling_probs": True,
}

# refused by name unless at llama-server's default: a sampler, a lazy feature or an output shape the
# engine does not have (value given here: a non-default one)
# (non-default value, llama-server's default; None where only leaving it out is neutral)
REFUSED: dict[str, tuple[Any, Any]] = {
    "dynatemp_range": (0.5, 0.0), "n_indent": (4, 0), "n_cmpl": (2, 1), "typical_p": (0.9, 1.0),
    "repeat_last_n": (256, 64), "dry_multiplier": (0.8, 0.0), "xtc_probability": (0.5, 0.0), "mirostat": (2, 0),
    "min_keep": (2, 0), "t_max_predict_ms": (500, 0),
    "samplers": (["top_k", "temperature"], None), "response_fields": (["content"], []),
}

# inert: accepted and without effect, because what they tune is off (each's reason)
INERT: dict[str, tuple[Any, str]] = {
    "dynatemp_exponent": (2.0, "tunes dynatemp_range, which is refused unless 0"),
    "dry_base": (2.0, "tunes dry_multiplier, refused unless 0"),
    "dry_allowed_length": (3, "tunes dry_multiplier, refused unless 0"),
    "dry_penalty_last_n": (64, "tunes dry_multiplier, refused unless 0"),
    "dry_sequence_breakers": (["\n"], "tunes dry_multiplier, refused unless 0"),
    "xtc_threshold": (0.2, "tunes xtc_probability, refused unless 0"),
    "mirostat_tau": (4.0, "tunes mirostat, refused unless 0"),
    "mirostat_eta": (0.2, "tunes mirostat, refused unless 0"),
    "sse_ping_interval": (5, "keep-alive comments in a stream; no token or field changes"),
}


def _parse(**fields: Any) -> Any:
    body = {"prompt": "Hello", **fields}
    return native_completion.parse(json.dumps(body).encode(), n_vocab=49152)


def test_every_documented_field_is_classified_once() -> None:
    classes = [set(HONOURED), set(REFUSED), set(INERT)]
    assert set().union(*classes) == set(DOCUMENTED), set(DOCUMENTED) ^ set().union(*classes)
    assert sum(len(c) for c in classes) == len(set(DOCUMENTED)), "a field in two classes"


@pytest.mark.parametrize("field", sorted(HONOURED))
def test_honoured_fields_are_taken(field: str) -> None:
    req, gen = _parse(**{field: HONOURED[field]})
    assert gen is not None


@pytest.mark.parametrize("field,bad", [("n_keep", -2), ("n_cache_reuse", -1), ("n_keep", "4")])
def test_context_fields_out_of_range_are_named(field: str, bad: Any) -> None:
    with pytest.raises(ApiError) as exc:
        _parse(**{field: bad})
    assert exc.value.status == 400 and exc.value.param == field, str(exc.value)


def test_context_fields_reach_the_engine_request() -> None:
    _, gen = _parse(n_keep=-1, n_cache_reuse=32)
    assert (gen.n_keep, gen.n_cache_reuse) == (-1, 32)
    _, gen = _parse()
    assert (gen.n_keep, gen.n_cache_reuse) == (None, None)


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_refused_fields_are_named_and_their_default_passes(field: str) -> None:
    value, default = REFUSED[field]
    with pytest.raises(ApiError) as exc:
        _parse(**{field: value})
    assert exc.value.status == 400 and exc.value.param == field and field in str(exc.value), str(exc.value)
    if default is not None:
        _parse(**{field: default})


@pytest.mark.parametrize("field", sorted(INERT))
def test_inert_fields_are_accepted(field: str) -> None:
    _parse(**{field: INERT[field][0]})
