"""A request's ``logit_bias`` made into token ids of the serving model (hydrad.wire.logitbias read
it): a text entry biases each token the model splits it into, as llama-server does; a token id
outside the vocabulary is the request's fault. Bounded by the doors (at most 1,024 entries and
16 KiB of text), so tokenizing them costs the engine thread well under a millisecond."""

from __future__ import annotations

from typing import Any

from hydrad.engine.promptprep import RequestRefused


def resolve(model: Any, entries: list[tuple[int | str, float | None]] | None) -> tuple[tuple[int, float], ...]:
    """``(token, bias)`` pairs for ``model`` (a ban as -inf); RequestRefused naming ``logit_bias`` for a
    token id the model does not have."""
    if not entries:
        return ()
    n_vocab = model.n_vocab
    out: list[tuple[int, float]] = []
    for target, bias in entries:
        value = float("-inf") if bias is None else float(bias)
        if isinstance(target, int):
            if target >= n_vocab:
                raise RequestRefused(f"logit_bias: token {target} is not in this model's vocabulary "
                                     f"(0..{n_vocab - 1})", 400, "invalid_field", param="logit_bias")
            out.append((target, value))
        else:
            out.extend((tok, value) for tok in model.tokenize(target, add_special=False, parse_special=False))
    return tuple(out)
