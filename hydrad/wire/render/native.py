"""llama-server's native answers for ``/completion`` and ``/infill``: one JSON object, or
server-sent ``data:`` events of ``content`` pieces (and ``prompt_progress`` when asked) ending in an
object with ``stop: true`` and the totals (no ``[DONE]`` line, as llama-server)."""

from __future__ import annotations

from typing import Any, Mapping

from hydrad.wire import logprobs as lp
from hydrad.wire.events import Done, Progress, Token, Usage
from hydrad.wire.native_completion import NativeCompletionRequest
from hydrad.wire.openai import INT32_MAX, ApiError
from hydrad.wire.render.base import Renderer, sse, timings, usage_timings


def stop_type(finish_reason: str, stop_word: str | None) -> str:
    """llama-server's ``stop_type`` for how a generation ended."""
    if finish_reason == "length":
        return "limit"
    return "word" if stop_word else "eos"


def generation_settings(req: NativeCompletionRequest, defaults: Mapping[str, Any], n_ctx: int | None,
                        model: str) -> dict[str, Any]:
    """The settings the request ran with (its own, else the engine's defaults), as llama-server
    reports them; a subset: the sampling fields this engine has."""
    s = req.sampling()
    out = {name: getattr(s, name) if getattr(s, name) is not None else defaults.get(name)
           for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")}
    limit = req.limit()
    out.update(n_ctx=n_ctx, n_predict=defaults.get("n_predict", -1) if limit is None else -1 if limit == INT32_MAX
               else limit, repeat_last_n=defaults.get("repeat_last_n"), presence_penalty=s.presence_penalty,
               frequency_penalty=s.frequency_penalty, stop=req.stops(), ignore_eos=req.ignore_eos, stream=req.stream,
               n_keep=defaults.get("n_keep", 0) if req.n_keep is None else req.n_keep,
               n_cache_reuse=defaults.get("n_cache_reuse", 0) if req.n_cache_reuse is None else req.n_cache_reuse,
               n_probs=req.n_probs or 0, cache_prompt=defaults.get("cache_prompt") if req.cache_prompt is None else req.cache_prompt,
               post_sampling_probs=req.post_sampling_probs, timings_per_token=req.timings_per_token, model=model,
               logit_bias=defaults.get("logit_bias", []))
    return out


def result(*, content: str, finish_reason: str, stop_word: str | None, tokens: list[int], prompt_tokens: int,
           cached_tokens: int, predicted: int, timings: dict[str, Any], model: str, slot: int | None,
           settings: dict[str, Any], probs: list[lp.TokenLogprob] | None = None,
           truncated: bool = False, post: bool = False) -> dict[str, Any]:
    """The whole answer (non-streamed), or with ``content`` empty the last event of a stream.
    ``probs``: the tokens' ``completion_probabilities`` (None: not asked, or already streamed)."""
    out = {"index": 0, "content": content, "tokens": tokens, "id_slot": -1 if slot is None else slot, "stop": True,
           "model": model, "tokens_predicted": predicted, "tokens_evaluated": prompt_tokens,
           "generation_settings": settings, "has_new_line": "\n" in content, "truncated": truncated,
           "stop_type": stop_type(finish_reason, stop_word), "stopping_word": stop_word or "",
           "tokens_cached": cached_tokens, "timings": timings}
    if probs is not None:
        out["completion_probabilities"] = lp.content(probs, post)
    return out


def chunk(content: str, tokens: tuple[int, ...], probs: tuple[lp.TokenLogprob, ...] | None = None,
          post: bool = False, so_far: Usage | None = None) -> bytes:
    """One streamed piece: llama-server sends only these fields until the end, the probabilities
    of the piece's tokens when the request asked (``n_probs``; ``post``: after the sampler chain),
    and the timings so far when it asked for them (``timings_per_token``)."""
    out: dict[str, Any] = {"index": 0, "content": content, "tokens": list(tokens), "stop": False}
    if so_far is not None:
        out.update(tokens_predicted=so_far.completion_tokens, tokens_evaluated=so_far.prompt_tokens,
                   timings=usage_timings(so_far))
    if probs is not None:
        out["completion_probabilities"] = lp.content(probs, post)
    return sse(out)


def progress_chunk(progress: dict[str, int], slot: int, prompt_tokens: int, timed: bool = False) -> bytes:
    """One ``prompt_progress`` event of a stream that asked (``return_progress``), in llama-server's
    shape: a piece with no content, ``progress`` being ``{total, cache, processed, time_ms}``; with
    ``timed`` (``timings_per_token``) the timings so far too, all zero before a prompt token is decoded."""
    out: dict[str, Any] = {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": slot,
                           "tokens_predicted": 0, "tokens_evaluated": prompt_tokens, "prompt_progress": progress}
    if timed:
        n = progress["processed"] - progress["cache"]
        ms = float(progress["time_ms"]) if n > 0 else 0.0
        out["timings"] = {"prompt_n": n, "prompt_ms": ms, "prompt_per_token_ms": ms / n if n > 0 else 0.0,
                          "prompt_per_second": 1e3 / ms * n if ms > 0 else 0.0, "predicted_n": 0,
                          "predicted_ms": 0.0, "predicted_per_token_ms": 0.0, "predicted_per_second": 0.0,
                          "cache_n": progress["cache"]}
    return sse(out)


class NativeAnswer(Renderer):
    """``req`` is the parsed request (its own fields go into ``generation_settings``; the engine's
    values it ran with come in the end event's ``settings``)."""

    dialect = "llama.completion"

    def __init__(self, req: NativeCompletionRequest, model: str) -> None:
        self.req, self.model = req, model
        self.asked = req.wants_logprobs() is not None

    def _settings(self, done: Done) -> dict[str, Any]:
        engine = done.settings or {}
        return generation_settings(self.req, engine, engine.get("n_ctx"), self.model)

    def piece(self, ev: Token) -> bytes:
        return chunk(ev.text, ev.ids, ev.probs if self.asked else None, self.req.post_sampling_probs, ev.usage)

    def progress(self, ev: Progress) -> bytes:
        return progress_chunk(ev.body(), ev.slot, ev.total, self.req.stream and self.req.timings_per_token)

    def end(self, done: Done, extra: dict[str, Any]) -> bytes:
        return sse(self._result(done, "", list(done.ids), extra))

    def broken(self, err: ApiError) -> bytes:
        return sse(err.body())

    def whole(self, pieces: list[Token], done: Done, extra: dict[str, Any]) -> dict[str, Any]:
        ids = [i for t in pieces for i in t.ids] + list(done.ids) if self.req.return_tokens else []
        probs = [p for t in pieces for p in t.probs] if self.asked else None
        return self._result(done, "".join(t.text for t in pieces), ids, extra, probs)

    def _result(self, done: Done, content: str, ids: list[int], extra: dict[str, Any],
                probs: list[lp.TokenLogprob] | None = None) -> dict[str, Any]:
        u = done.usage
        return result(content=content, finish_reason=done.finish_reason, stop_word=done.stop_word, tokens=ids,
                      prompt_tokens=u.prompt_tokens, cached_tokens=u.cached_tokens, predicted=u.completion_tokens,
                      timings=timings(done, extra), model=done.model or self.model, slot=done.slot,
                      settings=self._settings(done), probs=probs, truncated=done.truncated,
                      post=self.req.post_sampling_probs)
