"""The prompt of a fill-in-the-middle request (/infill), built from the model's FIM tokens exactly
as llama-server's ``format_prompt_infill`` builds it, so that a client tuned against llama-server
(an editor plugin) gets the same prompt, token for token.

The repository-level pattern (Qwen2.5-Coder's), each part present only when the vocabulary has
its token::

    [FIM_REP]myproject\\n [FIM_SEP]filename0\\n text0 ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]

Without a FIM_SEP token the extra chunks are separated by a plain-text snippet line. The prefix
keeps its last 3/4 of a batch of tokens and the suffix its first quarter less the prompt, so the
part around the cursor is prefilled in one step; the extra chunks fill what the context has left
past one batch and twice the engine's default ``n_predict`` (llama-server's arithmetic, kept
even where it leaves little room: with ``n_batch`` equal to ``n_ctx`` only a couple of extra tokens
survive). No spm (suffix-prefix-middle) ordering: llama-server's ``--spm-infill`` is off by default
and the engine has no such parameter.
"""

from __future__ import annotations

from typing import Any, Iterable

from hydrad.engine.llama import Model

NEEDED = ("pre", "suf", "mid")
_NAMES = {"pre": "prefix", "suf": "suffix", "mid": "middle"}
SNIPPET = "\n\n--- snippet ---\n\n"


def missing(model: Model) -> list[str]:
    """The FIM tokens /infill needs that the model lacks, as llama-server names them."""
    fim = model.fim_tokens()
    return [_NAMES[k] for k in NEEDED if fim[k] is None]


def prompt(model: Model, prefix: Iterable[str | int], suffix: Iterable[str | int], extra: Iterable[Any],
           middle: str, *, n_batch: int, n_predict: int, n_ctx: int) -> list[int]:
    """The prompt's token ids. ``prefix`` and ``suffix`` are texts and token ids in order,
    ``extra`` the chunks (``.filename``, ``.text``), ``middle`` the request's ``prompt``; the model
    must have the tokens :func:`missing` checks."""
    fim = model.fim_tokens()

    def tok(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=False)

    def mixed(parts: Iterable[str | int]) -> list[int]:
        return [t for p in parts for t in ([p] if isinstance(p, int) else tok(p))]

    extra_tokens: list[int] = []
    if fim["rep"] is not None:
        extra_tokens += [fim["rep"], *tok("myproject\n")]
    for chunk in extra:
        extra_tokens += [fim["sep"], *tok(chunk.filename + "\n")] if fim["sep"] is not None else tok(SNIPPET)
        extra_tokens += tok(chunk.text)
    if fim["sep"] is not None:
        extra_tokens += [fim["sep"], *tok("filename\n")]

    pre, suf = mixed(prefix), mixed(suffix)
    mid = model.tokenize(middle, add_special=False, parse_special=True) if middle else []
    n_pre = min(len(pre), 3 * (n_batch // 4))
    n_suf = min(len(suf), max(0, n_batch // 4 - (2 + len(mid))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    bos = model.added_bos()
    head = [] if bos is None else [bos]
    return [*extra_tokens[len(extra_tokens) - n_extra:], *head, fim["pre"], *pre[len(pre) - n_pre:], *mid,  # type: ignore[list-item]
            fim["suf"], *suf[:n_suf], fim["mid"]]  # type: ignore[list-item]  # present: missing() is checked first

