"""The runtime parameters of speculative decoding (``spec_*``), a part of
:class:`~hydrad.common.params.RuntimeParams`.

Kept apart because they are one feature's settings with rules between them (a draft model's type
needs its file, a shortest draft no longer than the longest). Tiers are written as numbers here
(2: the context is rebuilt, 3: the model is reloaded) since :class:`~hydrad.common.params.Tier`
lives in the module that builds on this one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

_T2, _T3 = 2, 3

SPEC_TYPES = ("none", "ngram", "ngram-mod", "draft")
SPELLINGS = {"ngram-simple": "ngram", "ngram_simple": "ngram", "ngram_mod": "ngram-mod", "draft-simple": "draft",
             "draft_simple": "draft"}
"""llama-server's names of the same kinds (its ``--spec-type`` values)."""


def _f(default: Any, tier: int, description: str, **kw: Any) -> Any:
    return Field(default, description=description, json_schema_extra={"tier": tier}, **kw)


class SpecParams(BaseModel):
    """Speculative decoding: who proposes drafts, how long they are, and the draft model."""

    spec_type: Literal["none", "ngram", "ngram-mod", "draft"] = _f(
        "none", _T2, "Speculative decoding (llama-server's --spec-type). ngram = prompt lookup as llama-server's "
        "ngram-simple (that spelling is accepted too): the last spec_ngram_size tokens of a slot are looked up "
        "earlier in its prompt and answer and the tokens that followed them there are the draft. ngram-mod = "
        "llama-server's ngram-mod: each token of the draft is looked up in turn from the n-gram ending at the one "
        "before it (so a draft goes on past the end of one earlier occurrence), and a draft shorter than "
        "spec_n_min is not decoded. draft = a draft model (spec_draft_model) proposes up to spec_n_max tokens "
        "greedily. In every kind the draft is decoded in the same step as the other slots' tokens, and the model's "
        "own choice at each drafted position keeps the drafted tokens it agrees with (so the answer is the one "
        "it would be without). n-gram kinds pay where answers copy their input (code edits, quoting). A request "
        "with a grammar, logprobs or a thinking budget never speculates.")
    spec_n_max: int = _f(
        16, _T2, "Most draft tokens a slot decodes in one step (llama-server's --spec-draft-n-max; its "
        "ngram-simple drafts --spec-ngram-simple-size-m, 48; its ngram-mod --spec-ngram-mod-n-max, 64). Also named "
        "speculative.n_max.", ge=1, le=256)
    spec_n_min: int = _f(
        0, _T2, "A draft found shorter than this is not decoded; one cut short only by the answer's or the "
        "context's end is, as in llama-server (--spec-draft-n-min; its ngram-mod --spec-ngram-mod-n-min, 48). Also "
        "named speculative.n_min.", ge=0, le=256)
    spec_ngram_size: int = _f(
        12, _T2, "Tokens of the n-gram looked up (llama-server's --spec-ngram-simple-size-n, whose default this "
        "is; its ngram-mod's --spec-ngram-mod-n-match is 24): shorter finds drafts more often and more of them "
        "wrong.", ge=1, le=1024)
    spec_p_min: float = _f(
        0.0, _T2, "A draft model's draft stops before a token it gives less than this probability "
        "(llama-server's --draft-p-min, whose default this is); 0 = always spec_n_max tokens, as the context "
        "leaves room for. Also named speculative.p_min.", ge=0.0, le=1.0)
    spec_draft_model: str | None = _f(
        None, _T3, "The draft model of spec_type draft (llama-server's --model-draft): a GGUF file, absolute or "
        "under models_dir, whose vocabulary is the served model's (checked at load: the same token count, special "
        "tokens and token texts, or the load fails naming both). Loaded with the model, with a context of its own "
        "(one sequence per slot). Also named speculative.model.", min_length=1, max_length=4096)
    spec_draft_n_ctx: int = _f(
        0, _T3, "The draft model's context in tokens, shared by its sequences as the model's is (llama-server's "
        "--ctx-size-draft); 0 = n_ctx. Also named speculative.n_ctx.", ge=0)
    spec_draft_n_gpu_layers: int = _f(
        -1, _T3, "The draft model's layers offloaded to the GPU (llama-server's --gpu-layers-draft); -1 = all. "
        "Ignored on a CPU-only build. Also named speculative.n_gpu_layers.", ge=-1)

    @field_validator("spec_type", mode="before")
    @classmethod
    def _spec_type(cls, v: Any) -> Any:
        return SPELLINGS.get(v, v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _together(self) -> "SpecParams":
        """Rules between fields: checked on the parameters in force (every layer merged), not on one layer
        alone (a registry entry may set spec_n_min where the YAML defaults set spec_n_max)."""
        if self.spec_n_min > self.spec_n_max:
            raise ValueError(f"spec_n_min {self.spec_n_min} is more than spec_n_max ({self.spec_n_max}): no draft "
                             "would ever be long enough")
        if self.spec_type == "draft" and not self.spec_draft_model:
            raise ValueError("spec_type draft needs spec_draft_model (the draft model's GGUF)")
        return self
