"""Counters the engine thread bumps and /metrics reads.

Plain attributes written by one thread and read by another: each write is a single
attribute store under the GIL, so a reader sees a consistent value for each counter.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class EngineStats:
    requests_total: int = 0
    requests_finished_total: int = 0
    requests_cancelled_total: int = 0
    requests_failed_total: int = 0  # ended by an error of their own (the engine went on)
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    cache_reuse_tokens_total: int = 0  # of those, in chunks moved to new positions (n_cache_reuse)
    context_shifts_total: int = 0  # context shifts of generations that filled their slot (ctx_shift)
    tokens_predicted_total: int = 0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0  # the generating slots of each decode, summed (llamacpp:n_busy_slots_per_decode)
    n_tokens_max: int = 0  # the longest sequence a slot held (prompt + generation)
    spec_draft_tokens_total: int = 0  # speculative decoding: tokens drafted (decoded as a guess)
    spec_accepted_tokens_total: int = 0  # ... of them the model agreed with
    spec_drafts_total: int = 0  # ... drafts verified
    prompt_seconds_total: float = 0.0
    predicted_seconds_total: float = 0.0
    model_loads_total: int = 0
    model_load_seconds: float = 0.0
    context_rebuilds_total: int = 0
    sleeps_total: int = 0  # models freed after sleep_idle_seconds without a request (hydrad.engine.sleep)
    peer_losses_total: int = 0  # generations set aside because a COMBINE peer died
    lora_switches_total: int = 0  # steps that set other LoRA scales on the context than the step before
    # where a step's wall time goes, on the engine thread (one step = one batch decoded and its rows
    # sampled): building the batch and the llama_decode call (on a GPU it only queues the work);
    # the text work done while the device computes; waiting for the device; sampling and handing
    # tokens on; and the gap to the next step while steps follow each other (commands, admission)
    steps_total: int = 0
    steps_unwaited_total: int = 0  # steps of prompt rows only, left computing while the next one was built
    step_submit_seconds_total: float = 0.0
    step_overlap_seconds_total: float = 0.0
    step_device_wait_seconds_total: float = 0.0
    step_sample_seconds_total: float = 0.0
    step_between_seconds_total: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
