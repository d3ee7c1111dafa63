"""The design's parameter contract, read from the repository's copy (docs/params-contract.md): every
field it names is carried by a runtime parameter or refused by name with the reason
(hydrad.common.paramcontract), and a payload naming a refused one is answered with that reason.

When the design text itself lies beside the checkout (``../shared/PARAMS-CONTRACT.md``), the copy is
checked to name the same fields, tier by tier.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hydrad.common import paramcontract as pc
from hydrad.common.params import ALIASES, T4_FIELDS, ParamError, ParamLayers, RuntimeParams, Tier, check_partial

REPO = Path(__file__).resolve().parents[3]
COPY = REPO / "docs" / "params-contract.md"
DESIGN = REPO.parent / "shared" / "PARAMS-CONTRACT.md"
_TIER_HEAD = re.compile(r"^## (T[1-4])\b", re.M)


def _sections(text: str) -> dict[int, str]:
    """Each tier's section of a contract text (from its ``## Tn`` heading to the next ``## ``)."""
    out: dict[int, str] = {}
    for m in _TIER_HEAD.finditer(text):
        start = text.find("\n", m.end()) + 1  # the heading's own words name no field
        end = text.find("\n## ", start)
        out[int(m.group(1)[1])] = text[start: end if end >= 0 else len(text)]
    return out


def design_names(section: str) -> set[str]:
    """The field names a design section names: every identifier with an underscore, a dot or a
    wildcard (not the names of llama.cpp's structs, ``common_params_*``), and every item of its
    comma list that is one word (``model``, ``numa``)."""
    text = re.sub(r"\*(\w+)\*", r"\1", section.replace("`", ""))
    names = {m.group(0).rstrip(".") for m in re.finditer(r"[a-z][a-z0-9_]*(?:\.(?:[a-z_]+|\*))?\*?", text)
             if any(c in m.group(0).rstrip(".") for c in "_.*") and not m.group(0).startswith("common_")}
    flat = re.sub(r"\([^()]*\)", "", text)
    for item in flat.split(","):
        words = item.strip().rstrip(".").split()
        if len(words) == 1 and re.fullmatch(r"[a-z][a-z0-9_.]*\*?", words[0]):
            names.add(words[0])
    return names


def copy_fields() -> dict[int, list[str]]:
    """The copy's field lists: each tier section's ``- `name` `` items."""
    return {tier: re.findall(r"^- `([^`]+)`", body, re.M) for tier, body in _sections(COPY.read_text()).items()}


def copy_design_names() -> dict[int, set[str]]:
    """The copy's record of the names the design gives, per tier (its "The design names:" line)."""
    out = {}
    for tier, body in _sections(COPY.read_text()).items():
        m = re.search(r"^The design names: (.*)$", body, re.M)
        out[tier] = set(re.findall(r"`([^`]+)`", m.group(1))) if m else set()
    return out


def _covers(name: str, fields: list[str]) -> bool:
    """Whether a design name (a field, a ``prefix*`` group, or another spelling) is one of ``fields``."""
    if name.endswith("*"):
        stem = name[:-1]
        return any(f.startswith(stem) for f in fields)
    return any(name in (f, f.rpartition(".")[2]) or f.startswith(name + ".") or name in pc.BY_NAME[f].also
               for f in fields if f in pc.BY_NAME)


def test_every_field_of_the_copy_is_carried_or_refused_by_name_with_its_tier() -> None:
    listed = copy_fields()
    assert set(listed) == {1, 2, 3, 4} and sum(map(len, listed.values())) >= 150
    for tier, names in listed.items():
        for name in names:
            entry = pc.BY_NAME.get(name)
            assert entry is not None, f"{name} (T{tier}) is neither carried nor refused in hydrad.common.paramcontract"
            assert entry.tier == tier, f"{name}: T{tier} in the contract, T{entry.tier} in paramcontract"
            if entry.param is not None:
                assert entry.param in RuntimeParams.model_fields, f"{name}: carried by {entry.param}, no such parameter"
            else:
                assert entry.reason, f"{name}: refused without a reason"
    every = [n for names in listed.values() for n in names]
    assert len(every) == len(set(every)), "a field is listed twice"
    assert set(every) == set(pc.BY_NAME), f"in paramcontract, not in the copy: {sorted(set(pc.BY_NAME) - set(every))}"


def test_the_copy_covers_every_name_the_design_gives() -> None:
    listed, named = copy_fields(), copy_design_names()
    for tier in (1, 2, 3):
        assert named[tier], f"T{tier}: the copy records no design names"
        for name in named[tier]:
            assert _covers(name, listed[tier]), f"T{tier}: the design's {name} is in no field of the copy"


@pytest.mark.skipif(not DESIGN.is_file(), reason="the design text is not beside this checkout")
def test_the_copy_names_what_the_design_names() -> None:
    design, named = _sections(DESIGN.read_text()), copy_design_names()
    for tier in (1, 2, 3):
        assert design_names(design[tier]) == named[tier], f"T{tier}: the copy's design names differ from the design's"


def test_each_carried_field_takes_its_tier_from_its_parameter_and_names_a_test_that_exists() -> None:
    for e in pc.ENTRIES:
        if e.param is None:
            continue
        if e.test is not None:
            path, _, func = e.test.partition("::")
            src = (REPO / path).read_text()
            assert re.search(rf"^(async )?def {func}\(", src, re.M), f"{e.name}: {e.test} does not exist"
        spelled = e.short
        if spelled != e.param and spelled not in RuntimeParams.model_fields:
            assert ALIASES[spelled] == e.param, f"{e.name}: llama.cpp's spelling {spelled} is not accepted"


def test_refused_fields_are_no_runtime_parameter() -> None:
    for e in pc.ENTRIES:
        if e.refused:
            assert pc.refused_key(e.name) is e or e.name in RuntimeParams.model_fields or e.name in T4_FIELDS \
                or e.short in RuntimeParams.model_fields, e.name


# ----- a payload naming a refused field: 400 naming it, with the reason ---------------------------

GROUPS = {  # one field of each kind of refusal, and the words its answer must hold
    "not served": ("image_min_tokens", "the projector's own token counts"),
    "a draft model's cache": ("speculative.cache_type_k", "the draft model's KV cache takes the model's"),
    "C callback": ("cb_eval", "C callback"),
    "terminal": ("interactive_first", "terminal"),
    "sampler": ("mirostat", "no such sampler"),
    "another spelling": ("typical_p", "no such sampler"),
    "per request": ("frequency_penalty", "set per request (frequency_penalty)"),
    "multimodal": ("image", "a request carries its images"),
    "tool output": ("logits_file", "writes no such files"),
    "TLS": ("ssl_file_cert", "plain HTTP"),
    "HTTP threads": ("n_threads_http", "event loop"),
}


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_configure_naming_a_refused_field_is_refused_with_the_reason(group: str) -> None:
    field, words = GROUPS[group]
    with pytest.raises(ParamError) as err:
        ParamLayers().plan({"temperature": 0.5, field: 1})
    assert err.value.fields == [field] and err.value.code == "unsupported_param"
    assert str(err.value).startswith(f"{field}: ") and words in str(err.value)
    with pytest.raises(ValueError, match=re.escape(words)):  # a YAML defaults block, a registry entry's defaults
        check_partial({field: 1})


def test_a_fixed_field_at_its_value_changes_nothing_and_any_other_value_is_refused() -> None:
    layers = ParamLayers()
    plan = layers.plan({"cont_batching": True, "swa_full": True, "temp": 0.25})
    assert plan.changed == ["temperature"] and plan.tier == Tier.T1 and plan.effective.temperature == 0.25
    with pytest.raises(ParamError, match="cont_batching: only true is accepted: continuous batching is always on"):
        layers.plan({"cont_batching": False})
    with pytest.raises(ParamError, match="no_kv_offload: only false"):
        layers.plan({"no_kv_offload": 1})  # 1 is not false
    assert check_partial({"no_perf": False, "flash_attn_type": "on"}) == {"flash_attn": "on"}


def test_llama_cpp_spellings_are_the_projects_parameters() -> None:
    plan = ParamLayers().plan({"penalty_repeat": 1.3, "rope_scaling_type": "yarn", "tensor_buft_overrides": ["x=CPU"]})
    assert plan.effective.repeat_penalty == 1.3 and plan.effective.rope_scaling == "yarn"
    assert plan.effective.override_tensors == ["x=CPU"] and plan.tier == Tier.T3
    with pytest.raises(ParamError, match="temp and temperature are one parameter"):
        ParamLayers().plan({"temp": 0.1, "temperature": 0.2})


def test_a_name_nobody_knows_is_still_unknown() -> None:
    with pytest.raises(ParamError) as err:
        ParamLayers().plan({"no_such_knob": 1})
    assert err.value.code == "unknown_param" and err.value.fields == ["no_such_knob"]


# ----- a request naming a refused sampling field: 400 naming it, with the reason ------------------

@pytest.mark.parametrize("door", ["chat", "completion", "native", "anthropic"])
def test_a_request_naming_a_refused_field_is_refused_with_the_reason(door: str) -> None:
    import json

    from hydrad.wire import anthropic, native_completion, openai

    bodies = {"chat": {"messages": [{"role": "user", "content": "hi"}]}, "completion": {"prompt": "hi"},
              "native": {"prompt": "hi"}, "anthropic": {"model": "m", "max_tokens": 4,
                                                        "messages": [{"role": "user", "content": "hi"}]}}
    parse = {"chat": lambda b: openai.parse("chat", b), "completion": lambda b: openai.parse("completion", b),
             "native": native_completion.parse, "anthropic": anthropic.parse}[door]
    with pytest.raises(openai.ApiError) as err:
        parse(json.dumps({**bodies[door], "mirostat": 2}).encode())
    assert err.value.status == 400 and err.value.param == "mirostat"
    assert "mirostat (hydrad's sampler chain has no such sampler)" in err.value.message
    if door != "anthropic":  # llama-server's clients send fields llama-server ignores: those pass as before
        parse(json.dumps({**bodies[door], "some_client_field": 1}).encode())


def test_a_profile_naming_a_refused_field_is_refused_with_the_reason() -> None:
    from pydantic import ValidationError

    from hydrad.coordinator.profiles import EngineEntry

    with pytest.raises(ValidationError, match="image_max_tokens: hydrad takes images through its mmproj projector"):
        EngineEntry(model="m", params={"image_max_tokens": 9})
    assert EngineEntry(model="m", params={"temp": 0.3, "cont_batching": True}).params["temp"] == 0.3
