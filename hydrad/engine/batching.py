"""Continuous batching on the engine thread: admit queued requests into free slots, build one
batch over every active sequence per step, sample, turn tokens into text, finish or fail one
request without touching the others.

:class:`Scheduler` is the engine core's component that owns the requests (the wait queue and
each slot's request); everything here runs on the engine thread. What a request needs before
it gets here (tokens, grammar) is made by :mod:`hydrad.engine.promptprep`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from functools import partial
from typing import Any

from hydrad.common.logs import log_event
from hydrad.engine import adapters, chatprompt, faults, kvshift, logitbias, sampling, speculate, thinking, vision
from hydrad.engine.active import Active, settings_of, take_ids, token_event, usage_of
from hydrad.engine.generation import Generation, Slot
from hydrad.engine.promptprep import RequestRefused
from hydrad.engine.requests import Done, Failed, Progress, RequestHandle
from hydrad.engine.textstream import StopMatcher, Utf8Detokenizer
from hydrad.wire.kvdigest import tokens_digest
from hydrad.wire.toolcalls import ToolStream


log = logging.getLogger("hydrad.engine")


UNLIMITED = 2**31 - 1  # a request's "until the context is full" (n_predict -1): a context shift never extends it
STEP_GAP_S = 0.05  # a step starting sooner than this after the last one counts its gap as between steps


def in_turns(waiting: deque[RequestHandle]) -> deque[RequestHandle]:
    """The queue with its clients taking turns (each client's own requests in their order): one
    client's 26 requests queued ahead of another's single one delay it by one request per free
    slot, not by all 26. A queue of one client comes back as it was."""
    clients: dict[str, list[RequestHandle]] = {}
    for h in waiting:
        clients.setdefault(h.request.client, []).append(h)
    if len(clients) < 2:
        return waiting
    out: deque[RequestHandle] = deque()
    rows = list(clients.values())
    for i in range(max(len(r) for r in rows)):
        out.extend(r[i] for r in rows if i < len(r))
    return out


class Scheduler:
    """Owns the requests: the wait queue, and each slot's request from admission to its end (a
    slot's KV is its generation's). Runs on the engine thread, except :meth:`enqueue`'s callers'
    reads of :attr:`waiting`'s length."""

    def __init__(self, core: Any) -> None:  # the EngineCore this is part of (it imports us)
        self.core = core
        self.waiting: deque[RequestHandle] = deque()
        self.deferred: list[tuple[Generation, Slot, Active]] = []  # text to make while the device computes
        self.unsynced: set[Generation] = set()  # steps queued on the device and not waited for (see step)
        self._t_step_end = 0.0  # when the last step ended (perf_counter), for the gap between steps
        self._lora_turn = 0  # steps that had to choose among several LoRA sets (adapters.Adapters.pick)

    def enqueue(self, handle: RequestHandle) -> None:
        core = self.core
        if not core.admitting:
            core.emit(handle, Failed("engine is shutting down", status=503, code="shutting_down"))
        elif core.gen is None and core.loader.current_load is None and core.asleep is None:
            core.emit(handle, Failed("no model is loaded", status=503, code="no_model"))
        elif len(self.waiting) >= core.max_queue and not (core.gen and core.gen.free_slot_exists()):
            core.emit(handle, Failed("all slots busy and the queue is full", status=503, code="queue_full"))
        else:
            handle.t_enqueued = time.monotonic()
            self.waiting.append(handle)
            core.stats.requests_total += 1

    def expire_waiting(self) -> None:
        """Requests queued while no generation admits them wait at most reload_queue_timeout_s."""
        if not self.waiting or (self.core.gen is not None and not self.core.draining()):
            return
        limit = (self.core.params.reload_queue_timeout_s if self.core.params else 30.0)
        now = time.monotonic()
        keep: deque[RequestHandle] = deque()
        for h in self.waiting:
            if now - h.t_enqueued > limit:
                self.core.emit(h, Failed(f"the engine is loading a model; waited {limit:.0f}s, retry later", status=503,
                                     code="reloading"))
            else:
                keep.append(h)
        self.waiting = keep


    def admit(self) -> None:
        gen = self.core.gen
        if gen is None or self.core.held() or not self.waiting:
            return
        deferred: deque[RequestHandle] = deque()
        if gen.free_slot_exists():  # (reordered only when someone can be admitted: not on every step)
            self.waiting = in_turns(self.waiting)
        while self.waiting:
            handle = self.waiting.popleft()
            want = handle.request.slot
            if want is not None and not 0 <= want < len(gen.slots):
                self.core.emit(handle, Failed(f"slot {want} does not exist (this engine has {len(gen.slots)})",
                                          status=400, code="invalid_slot"))
                continue
            if (want is not None and gen.slots[want].active is not None) or not gen.free_slot_exists():
                deferred.append(handle)
                continue
            try:
                self._start(gen, handle)
            except RequestRefused as exc:
                self.core.emit(handle, exc.failed())
            except Exception as exc:  # the request's own failure: it alone ends, the engine goes on
                self.request_failed(gen, handle, "admitting", exc)
        self.waiting = deferred

    def _start(self, gen: Generation, handle: RequestHandle) -> None:
        req = handle.request
        params = self.core.params or gen.params
        model = gen.model
        faulty = faults.stages_of(req) if self.core.faults_armed else faults.NONE
        self._fault("admit", faulty)
        if req.tokens is not None and req.tokens_for == gen.id:
            tokens = req.tokens
        else:
            self._fault("tokenize", faulty)
            tokens = self.core.prep.tokenize(gen, req)
        req.tokens = None  # not needed any more; a queued copy of a long prompt is memory
        media: vision.MediaPrompt | None = req.media if req.images else None  # type: ignore[assignment]  # made with the tokens (PromptPrep.media)
        req.media = None
        if not tokens:
            raise RequestRefused("the prompt is empty", 400, "empty_prompt")
        limit = gen.ctx.n_ctx_seq
        if len(tokens) >= limit:
            raise RequestRefused(f"the prompt has {len(tokens)} tokens; this engine's context holds {limit}",
                                400, "context_length_exceeded", n_prompt_tokens=len(tokens), n_ctx=limit)
        cache = params.cache_prompt if req.cache_prompt is None else req.cache_prompt
        try:  # KV computed under other LoRA scales is another namespace's (adapters.Adapters.owner)
            lora, ns = adapters.for_request(gen.adapters, req.lora, req.cache_ns)
        except adapters.AdapterRefused as exc:
            raise RequestRefused(str(exc), 400, "invalid_field", param="lora") from None
        slot = gen.slots[req.slot] if req.slot is not None else gen.pick_slot(
            tokens if cache else None,
            spare_tails=self.core.prefix.settings.min_tokens if self.core.prefix.settings.share else 0, owner=ns)
        # A slot's KV is reused only by requests of its own cache namespace, by the request pinned to an
        # untrusted upload (owner None, foreign), or by the request the pool pinned to the state it put
        # there itself: no other key learns a byte of it through cached_tokens.
        pinned = req.slot is not None
        own = slot.owner == ns or (pinned and (slot.owner is None or (req.pool_pin and slot.owner == "")))
        min_chunk = 0 if media is not None else params.n_cache_reuse if req.n_cache_reuse is None else req.n_cache_reuse
        if media is None:
            self.core.prefix.keep_before_overwrite(gen, slot, tokens, cache and own, params.cache_ram_mib)
        keep, moved = gen.reuse_prefix(slot, tokens, min_chunk) if cache and own else (gen.reset_slot(slot), 0)
        if media is not None:  # an image's KV is reused whole or not at all (no Store: vision.MediaPrompt)
            keep = gen.truncate(slot, media.whole(keep))
        elif cache:
            keep = self.core.prefix.extend(gen, slot, tokens, keep, req.stored_prefix, ns,
                                              req.store_quota)  # type: ignore[arg-type]
        slot.owner = ns
        req.stored_prefix = None
        gen.ensure_room(len(tokens) - keep, exclude=slot)
        s = req.sampling
        grammar = s.grammar if req.tools is None else self.core.prep.tool_grammar(gen, req)
        try:
            spec = sampling.Sampling(
                temperature=params.temperature if s.temperature is None else s.temperature,
                top_k=params.top_k if s.top_k is None else s.top_k,
                top_p=params.top_p if s.top_p is None else s.top_p,
                min_p=params.min_p if s.min_p is None else s.min_p,
                repeat_penalty=params.repeat_penalty if s.repeat_penalty is None else s.repeat_penalty,
                repeat_last_n=params.repeat_last_n,
                frequency_penalty=s.frequency_penalty, presence_penalty=s.presence_penalty,
                seed=params.seed if s.seed is None else s.seed,
                ban=tuple(model.eog_tokens()) if req.ignore_eos else (),
                bias=logitbias.resolve(model, s.logit_bias),
                grammar=grammar)
            sampler = sampling.Sampler(spec, model.n_vocab, limit, model.vocab,
                                       post=req.post_sampling_probs and req.logprobs is not None)
        except sampling.GrammarRefused as exc:
            raise RequestRefused(str(exc), 400, "invalid_field") from None
        room = limit - len(tokens)
        want = req.max_tokens if req.max_tokens is not None else params.n_predict if params.n_predict >= 0 else room
        # ctx_shift: a limit of its own (not "until the context is full") may run past the context
        shifting = params.ctx_shift and want > room and want != UNLIMITED and gen.ctx.can_shift and media is None
        max_tokens = want if shifting else min(want, room)
        handle.generation = gen.tag
        handle.t_admitted = time.monotonic()
        try:
            stopper = StopMatcher(req.stop)
        except ValueError as exc:
            sampler.free()
            raise RequestRefused(str(exc), 400, "invalid_stop") from None
        probs = None if req.logprobs is None else sampling.PostProbs(sampler, req.logprobs, model.piece) \
            if req.post_sampling_probs else sampling.Logprobs(model.n_vocab, req.logprobs, model.piece)
        slot.active = Active(handle=handle, prompt_len=len(tokens), cached=keep, pending=tokens[keep:],
                              max_tokens=max_tokens, sampler=sampler, detok=Utf8Detokenizer(),
                              stopper=stopper, t_start=time.monotonic(), faulty=faulty,
                              ids=[] if req.return_tokens else None, probs=probs,
                              tools=None if req.tools is None else ToolStream(chatprompt.tool_format(
                                  model, params.chat_template)),
                              think=thinking.start(model, params, req, tokens, grammar),
                              n_keep=kvshift.kept(params.n_keep if req.n_keep is None else req.n_keep, len(tokens),
                                                  model.added_bos() is not None, limit) if shifting else -1,
                              lora=lora, media=media, timings=req.timings_per_token)
        if req.report_settings:
            slot.active.settings = settings_of(params, spec, gen.ctx.n_ctx)
        drafting = speculate.settings_of(params)
        if drafting is not None and gen.drafts_ok and grammar is None and probs is None and not faulty and not media and (
                slot.active.think is None or slot.active.think.budget is None) and (
                drafting.kind != "draft" or gen.draft is not None):
            slot.active.spec = speculate.start(drafting, gen.ngrams, ns)  # (a grammar or a budget decides what a draft cannot)
        gen.n_active += 1
        if req.return_progress:
            self._progress(slot.id, slot.active)
        self.core.stats.prompt_tokens_total += len(tokens) - keep
        self.core.stats.cached_tokens_total += keep
        self.core.stats.cache_reuse_tokens_total += moved
        if max_tokens <= 0:
            self._finish(gen, slot, "length")

    def step(self, gen: Generation) -> None:
        t0 = time.perf_counter()
        batch, ctx = gen.batch, gen.ctx
        batch.clear()
        outputs: list[tuple[Slot, int]] = []
        before: list[tuple[Slot, int]] = []
        budget = batch.capacity
        lora = self._lora_set(gen)  # None: every slot (no adapters); else only the slots of this set
        drafting: list[Slot] = []
        for slot in gen.slots:
            a = slot.active
            if a is not None and a.next_token >= 0 and (lora is None or a.lora == lora):
                before.append((slot, len(slot.cache)))
                outputs.append((slot, batch.add(a.next_token, len(slot.cache), slot.id, True)))
                slot.cache.append(a.next_token)
                a.next_token = -1
                budget -= 1
                if a.spec is not None:
                    drafting.append(slot)
        n_prefill = 0
        watched: list[tuple[int, Active]] = []  # prefilled by this step and asking for progress
        if gen.vision is not None:
            self._image(gen)
        prompts = [slot for slot in gen.slots if slot.active is not None and slot.active.pending
                   and (lora is None or slot.active.lora == lora)]
        if len(prompts) > 1:
            prompts.sort(key=lambda slot: slot.active.t_start)  # type: ignore[union-attr]  # first come, first prefilled
            if (self.core.params or gen.params).prefill_split == "ubatch":
                ubatch = min(gen.params.n_ubatch, batch.capacity)
                budget = min(budget, max(ubatch - (batch.capacity - budget), ubatch // 4))
        for slot in prompts:
            a = slot.active
            assert a is not None
            if budget <= 0:
                break
            if a.handle.request.return_progress:
                watched.append((slot.id, a))
            take = a.pending[:budget if a.media is None else a.media.text_run(len(slot.cache), budget)]
            if not take:  # an image next: evaluated by a later step's _image
                continue
            before.append((slot, len(slot.cache)))
            last = len(take) == len(a.pending)
            idx = batch.add_run(take, len(slot.cache), slot.id, last)
            slot.cache.extend(take)
            del a.pending[:len(take)]
            budget -= len(take)
            n_prefill += len(take)
            if last:
                outputs.append((slot, idx))
        if drafting:  # after the prompts: a draft takes only what they leave of the batch
            speculate.add_drafts(gen, drafting, self.core.stats)
        if batch.n == 0:
            self.settle_text()
            return
        rc = batch.decode(ctx)
        self.core.stats.n_decode_total += 1
        self.core.stats.n_busy_slots_total += gen.n_active
        if rc == 1 and gen.evict_idle():  # KV pool full: free idle slots' caches and try the step again
            rc = batch.decode(ctx)
            self.core.stats.n_decode_total += 1
        t1 = time.perf_counter()
        if self.deferred:  # the device computes this step meanwhile; the first sample below waits for it
            self.settle_text()
            self.core.flush()
        if rc != 0:
            self._decode_failed(gen, rc, before)
            return
        t2 = time.perf_counter()
        if not outputs and not watched and self._text_overlap(gen):
            # Every row of this step is mid-prompt: nothing is read back, so the engine thread does not wait
            # for the device. It builds and queues the next step while this one computes (llama.cpp orders
            # them on the device, as it does the ubatches of one batch); the engine thread waits before
            # anything else touches the context (settle_device).
            self.unsynced.add(gen)
            self.core.stats.steps_unwaited_total += 1
        else:
            ctx.synchronize()  # (waits for any earlier step of this context left computing, too)
            self.unsynced.discard(gen)
        t3 = time.perf_counter()
        for slot_id, a in watched:  # before this step's tokens: the last progress says the prompt is done
            self._progress(slot_id, a)
        now = time.monotonic()
        overlap = self._text_overlap(gen)
        for slot, idx in outputs:
            a = slot.active
            if a is None:  # a stop string found while the device computed ended it: the row is discarded
                continue
            try:
                if a.faulty:  # per token: no call unless a test armed this request
                    self._fault("sample", a.faulty)
                if a.probs is not None:  # the raw row, before the sampler (the argmax masks banned tokens in it)
                    a.probs.measure(ctx, idx)
                if a.think is not None and a.think.forced:  # the end of a think block, written for the model
                    tok = a.think.forced.popleft()
                    a.sampler.force(tok)
                else:
                    tok = a.sampler.sample(ctx, idx)
                if a.n_gen == 0:
                    a.t_first = now
                    a.handle.t_first_token = now
                self._on_token(gen, slot, a, tok, overlap and a.n_gen > 0)
                if a.spec is not None and a.spec.draft:
                    speculate.verify(gen, slot, a, self.core.stats, partial(self._on_token, gen, slot, a, defer=overlap))
            except Exception as exc:  # this request's failure, not the step's: the other slots go on
                if slot.active is a:
                    self.request_failed(gen, a.handle, "sampling", exc, slot)
        t4 = time.perf_counter()
        st = self.core.stats
        st.steps_total += 1
        st.step_submit_seconds_total += t1 - t0
        st.step_overlap_seconds_total += t2 - t1
        st.step_device_wait_seconds_total += t3 - t2
        st.step_sample_seconds_total += t4 - t3
        if t0 - self._t_step_end < STEP_GAP_S:
            st.step_between_seconds_total += t0 - self._t_step_end
        self._t_step_end = t4

    def _image(self, gen: Generation) -> None:
        """Evaluate the image the first prompt (first come) has reached, in a decode of its own (at most one a
        step: the others' tokens wait one image); a failure ends that request alone."""
        slots = [s for s in gen.slots if s.active is not None and s.active.media is not None and s.active.pending
                 and vision.is_image_token(s.active.pending[0])]
        if not slots or gen.vision is None:
            return
        slot = min(slots, key=lambda s: s.active.t_start)  # type: ignore[union-attr]
        a = slot.active
        assert a is not None
        self.settle_device()
        pos = len(slot.cache)
        try:
            n = gen.vision.evaluate(gen.ctx, a.media, pos, slot.id)
        except Exception as exc:
            gen.truncate(slot, pos)
            self.request_failed(gen, a.handle, "evaluating an image", exc, slot)
            return
        slot.cache.extend(a.pending[:n])
        del a.pending[:n]
        self.core.stats.n_decode_total += 1
        if a.handle.request.return_progress:
            self._progress(slot.id, a)

    def _lora_set(self, gen: Generation) -> tuple[float, ...] | None:
        """The LoRA scales of this step (None when the model has no adapters), set on the context when
        they differ from the last step's; the slots of other sets wait for a later step (see adapters)."""
        ad = gen.adapters
        if ad is None or not ad.loras:
            return None
        sets = [s.active.lora for s in gen.slots if s.active is not None and (s.active.next_token >= 0 or s.active.pending)]
        if not sets:
            return None
        if len(set(sets)) > 1:
            self._lora_turn += 1
        chosen = ad.pick(sets, self._lora_turn)
        if chosen != ad.applied:
            self.settle_device()  # llama.cpp reserves its graph again: never under a step still computing
            ad.use(gen.ctx, chosen)
            self.core.stats.lora_switches_total += 1
        return chosen

    def settle_device(self) -> None:
        """Wait for the steps left computing (see :meth:`_step`): before the engine thread does anything but
        queue another step, such as a command, an admission, a swap or an embedding."""
        while self.unsynced:
            self.unsynced.pop().ctx.synchronize()

    def _progress(self, slot_id: int, a: Active) -> None:
        self.core.emit(a.handle, Progress(total=a.prompt_len, cache=a.cached, processed=a.prompt_len - len(a.pending),
                                      time_ms=int((time.monotonic() - a.t_start) * 1000), slot=slot_id))

    def _text_overlap(self, gen: Generation) -> bool:
        mode = (self.core.params or gen.params).text_overlap
        return mode == "on" or (mode == "auto" and gen.asynchronous)

    def _on_token(self, gen: Generation, slot: Slot, a: Active, tok: int, defer: bool) -> None:
        """Token-level decisions now (end of generation, length); the text now, or once the next
        step is on the device when ``defer`` (the first token never waits: it is the TTFT)."""
        if tok == sampling.END_OF_GRAMMAR and a.n_gen == 0 and not a.handle.request.ignore_eos:
            raise sampling.GrammarUnsatisfiable("grammar: no token of this model can begin an answer the grammar "
                                             "allows (not even the end of the answer)")
        if tok == sampling.END_OF_GRAMMAR or gen.model.is_eog(tok):
            self._finish(gen, slot, "stop")
            return
        a.n_gen += 1
        stats = self.core.stats
        stats.tokens_predicted_total += 1
        if len(slot.cache) + 1 > stats.n_tokens_max:
            stats.n_tokens_max = len(slot.cache) + 1
        a.unsent.append(tok)
        if a.probs is not None:
            a.probs_unsent.append(a.probs.entry(tok))
        if a.n_gen >= a.max_tokens or (len(slot.cache) + 1 >= gen.ctx.n_ctx_seq and not self._shift(gen, slot, a)):
            self._finish(gen, slot, "length")
            return
        if defer:
            a.next_token = tok
            self.deferred.append((gen, slot, a))
        elif not self._text(gen, slot, a):
            a.next_token = tok

    def _shift(self, gen: Generation, slot: Slot, a: Active) -> bool:
        """The slot's context is full: shift it (ctx_shift) so that the request goes on; False when it
        does not shift (off, or nothing could be dropped) and the request ends."""
        if a.n_keep < 0 or not kvshift.context_shift(gen, slot, a.n_keep):
            return False
        a.shifts += 1
        self.core.stats.context_shifts_total += 1
        return True

    def _text(self, gen: Generation, slot: Slot, a: Active) -> bool:
        """Detokenize ``a``'s unsent tokens, stream the text out, watch for stop strings; True when
        a stop string ended the request."""
        tokens, a.unsent = a.unsent, []
        model = gen.model
        for tok in tokens:
            if a.faulty:  # per token: no call unless a test armed this request
                self._fault("detokenize", a.faulty)
            if a.ids is not None:
                a.ids.append(tok)
            if a.probs is not None:
                a.probs_made.append(a.probs_unsent.popleft())
            text = a.detok.push(model.piece(tok))
            if not text:
                continue
            if a.faulty:  # per token: no call unless a test armed this request
                self._fault("stop", a.faulty)
            out, stopped = a.stopper.push(text)
            if out:
                self._send(a, out)
            if stopped:
                self._finish(gen, slot, "stop", flush=False)
                return True
        if a.think is not None:
            a.think.check(a.n_gen)
        return False

    def _send(self, a: Active, text: str, end: bool = False) -> None:
        ev = token_event(a, text, end)
        if ev is not None:
            self.core.emit(a.handle, ev)

    def settle_text(self) -> None:
        """The deferred text of the last step, for requests still running (a cancelled one's is dropped)."""
        deferred, self.deferred = self.deferred, []
        for gen, slot, a in deferred:
            if slot.active is a and a.unsent:
                try:
                    self._text(gen, slot, a)
                except Exception as exc:
                    if slot.active is a:
                        self.request_failed(gen, a.handle, "making text", exc, slot)

    def _finish(self, gen: Generation, slot: Slot, reason: str, flush: bool = True) -> None:
        a = slot.active
        assert a is not None
        if flush:
            self._fault("finish", a.faulty)
            if a.unsent and self._text(gen, slot, a):
                return  # a stop string in the text not yet sent ended it first
            tail = a.detok.flush()
            out, stopped = a.stopper.push(tail) if tail else ("", False)
            out += "" if stopped else a.stopper.flush()
            if out:
                self._send(a, out)
            if stopped:
                reason = "stop"
        if a.tools is not None or a.think is not None:
            self._send(a, "", end=True)
        if a.tools is not None and a.tools.n_calls and reason == "stop":
            reason = "tool_calls"
        if a.spec is not None:  # a stop string found while a draft computed: the slot keeps the answer's tokens
            speculate.take_back(gen, slot, a.spec)
        now = time.monotonic()
        t_first = a.t_first or now
        usage = usage_of(a, now)
        self.core.stats.prompt_seconds_total += t_first - a.t_start
        self.core.prefix.prefill_seen(a.prompt_len - a.cached, t_first - a.t_start)
        self.core.stats.predicted_seconds_total += now - t_first
        self.core.stats.requests_finished_total += 1
        # llama-server's truncated: the context was shifted, or the generation ended for filling it
        truncated = a.shifts > 0 or (reason == "length" and len(slot.cache) + 1 >= gen.ctx.n_ctx_seq)
        if a.shifts:  # the slot keeps what a prefill gives; the next request is answered as by a fresh engine
            kvshift.drop_inexact(gen, slot)
        self.core.emit(a.handle, Done(reason, usage, gen.tag.fingerprint, gen.tag.model, slot.id, len(slot.cache),
                                      tokens_digest(slot.cache), a.stopper.matched, take_ids(a), a.settings,
                                      truncated))
        self.release(gen, slot)

    def _fault(self, stage: str, faulty: frozenset[str]) -> None:
        if stage in faulty:
            raise faults.InjectedFault(f"injected fault at stage {stage}")

    def request_failed(self, gen: Generation, handle: RequestHandle, stage: str, exc: Exception,
                        slot: Slot | None = None) -> None:
        """An exception while serving one request ends that request with a JSON error (500,
        ``request_failed``, never retried elsewhere: the same request would fail there too; a grammar
        too ambiguous to sample is the request's own doing, a 400) and frees its slot; the engine
        thread and every other request go on."""
        self.core.stats.requests_failed_total += 1
        if isinstance(exc, (sampling.GrammarTooSlow, sampling.GrammarUnsatisfiable)):  # what the request asked for: a 4xx
            log_event(log, logging.INFO, "request refused", req=handle.id, stage=stage, code=exc.code, error=str(exc))
            self.core.emit(handle, Failed(str(exc), status=400, code=exc.code))
        else:
            log_event(log, logging.ERROR, "request failed", req=handle.id, stage=stage, error=repr(exc), exc_info=True)
            self.core.emit(handle, Failed(f"the request failed while {stage}: {type(exc).__name__}: {exc}",
                                      status=500, code="request_failed"))
        if slot is None:  # failed while admitting: the slot may already have taken it
            slot = next((sl for sl in gen.slots if sl.active is not None and sl.active.handle is handle), None)
        if slot is not None and slot.active is not None and slot.active.handle is handle:
            try:
                self.release(gen, slot)
            except Exception as again:  # freeing its sampler failed too: drop the slot's bookkeeping anyway
                log_event(log, logging.ERROR, "slot release failed", slot=slot.id, error=repr(again))
                slot.active = None
                gen.n_active -= 1

    def release(self, gen: Generation, slot: Slot) -> None:
        a = slot.active
        if a is None:
            return
        if a.spec is not None:
            speculate.take_back(gen, slot, a.spec)
        a.sampler.free()
        if a.shifts:  # cancelled or failed after a shift (see _finish)
            kvshift.drop_inexact(gen, slot)
        slot.active = None
        slot.last_used = time.monotonic()
        gen.n_active -= 1

    def _decode_failed(self, gen: Generation, rc: int, before: list[tuple[Slot, int]]) -> None:
        """Undo this step's tokens; fail the affected requests with a clear reason."""
        for slot, n in before:
            gen.truncate(slot, n)
            if slot.active is not None and slot.active.spec is not None:
                slot.active.spec.draft = []  # (gone with the rest of the step)
        msg = ("the context is full (all slots together exceed n_ctx)" if rc == 1
               else f"llama_decode failed with code {rc}")
        log_event(log, logging.ERROR, "decode failed", rc=rc, slots=len(before))
        seen: set[int] = set()
        for slot, _ in before:
            if slot.id in seen or slot.active is None:
                continue
            seen.add(slot.id)
            self.core.emit(slot.active.handle, Failed(msg, status=503 if rc == 1 else 500,
                                                  code="context_full" if rc == 1 else "decode_error"))
            self.release(gen, slot)

    def cancel(self, handle: RequestHandle) -> None:
        try:
            self.waiting.remove(handle)
            return
        except ValueError:
            pass
        for gen in ([self.core.gen] if self.core.gen else []) + self.core.retiring:
            for slot in gen.slots:
                if slot.active is not None and slot.active.handle is handle:
                    self.core.stats.requests_cancelled_total += 1
                    self.release(gen, slot)
                    return

    def fail_all(self, message: str, engine_failed: bool, status: int = 500, code: str = "engine_error") -> None:
        self.settle_text()  # what was generated before the failure still reaches the client
        while self.waiting:
            self.core.emit(self.waiting.popleft(), Failed(message, engine_failed, status, code))
        for gen in ([self.core.gen] if self.core.gen else []) + self.core.retiring:
            for slot in gen.slots:
                if slot.active is not None:
                    self.core.emit(slot.active.handle, Failed(message, engine_failed, status, code))
                    self.release(gen, slot)


