"""The design's engine parameter contract, field by field: what the engine does with each one.

The design names every field of llama.cpp's ``common_params`` (and of its sampling, speculative
and model parts) with the tier a runtime change costs (docs/params-contract.md lists them). Each
such field is here exactly once, as one of:

- **carried** by a runtime parameter of :class:`~hydrad.common.params.RuntimeParams` (``param``,
  under the project's spelling where it differs: ``sampling.temp`` is ``temperature``), so a
  configure, the YAML ``defaults:``, a registry entry and a profile set it;
- **per request** only (``request``: the request field that carries it, e.g. ``sampling.n_probs``
  is /completion's ``n_probs``): the engine keeps no default for it, so a configure naming it is
  refused saying which request field to use;
- **fixed**: the engine always behaves as one value does (continuous batching is always on); a
  payload giving that value is accepted and changes nothing, any other is refused with the reason;
- **refused** with the reason (a C callback, a flag of llama-cli's terminal, a feature not built).

Nothing the design names is silently ignored and no refusal is a bare "unknown field": a payload
naming a refused field (or one of its other spellings) is answered with the field and the reason
(:func:`refusal`). ``test`` points at a test that shows a carried field taking effect, where one
exists. Keep each entry one line: other branches flip an entry from refused to carried.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

T1, T2, T3, T4 = 1, 2, 3, 4


@dataclass(frozen=True)
class Entry:
    """One contract field and what the engine does with it."""

    name: str  # llama.cpp's name, dotted below common_params ("sampling.temp", "cpuparams.n_threads")
    tier: int  # the design's tier (1-4)
    param: str | None = None  # the RuntimeParams field that carries it
    request: str | None = None  # the per-request field that carries it (no engine-wide default)
    reason: str | None = None  # why it is refused (or fixed), in words an operator can act on
    fixed: Any = None  # the one value accepted (as a no-op) for a fixed field; None: not fixed
    also: tuple[str, ...] = ()  # further spellings a payload may use (llama-server's, the design's)
    test: str | None = None  # tests/...::test_name showing a carried field take effect

    @property
    def refused(self) -> bool:
        return self.param is None

    @property
    def short(self) -> str:
        """The name as a flat payload key: the part after the last dot."""
        return self.name.rpartition(".")[2]


def _p(name: str, tier: int, param: str, test: str | None = None, also: tuple[str, ...] = ()) -> Entry:
    return Entry(name, tier, param=param, test=test, also=also)


def _q(name: str, tier: int, request: str, also: tuple[str, ...] = ()) -> Entry:
    return Entry(name, tier, request=request, also=also,
                 reason=f"set per request ({request}); the engine keeps no default for it")


def _r(name: str, tier: int, reason: str, also: tuple[str, ...] = ()) -> Entry:
    return Entry(name, tier, reason=reason, also=also)


def _fx(name: str, tier: int, value: Any, reason: str, also: tuple[str, ...] = ()) -> Entry:
    return Entry(name, tier, reason=reason, fixed=value, also=also)


NO_SAMPLER = "hydrad's sampler chain has no such sampler (a request setting it is refused too)"
TERMINAL = "llama-cli's interactive terminal flag; a daemon has no terminal"
NO_MULTIMODAL = "hydrad takes images through its mmproj projector, with the projector's own token counts; a request carries its images"
NO_CHECKPOINTS = "hydrad makes no context checkpoints (a slot's KV is kept whole)"
NO_PROMPT_FILE = "llama-cli's prompt cache file; the engine keeps prompts in its slots' KV (cache_prompt) and a pool's in its Store"
TOOL_OUTPUT = "output of llama.cpp's command-line tools (llama-embedding, llama-debug, perplexity); a daemon answers over HTTP and writes no such files"
AFFINITY = "hydrad runs on the CPUs it is given: set them with systemd's CPUAffinity= (or taskset)"
DRAFT_KV = "the draft model's KV cache takes the model's cache types and devices (cache_type_k, cache_type_v, devices)"
SAMPLER_STATE = "llama.cpp's own bookkeeping, derived from the request and the template, not a setting"
START_ONLY = "start-only setting: change it in the YAML (or on the command line) and restart the engine"

# tests that show a carried field take effect, used by several entries
_T = "tests/integration/test_engine_daemon.py"
_SAMPLING = "tests/integration/test_param_contract.py::test_sampling_defaults_by_llama_cpp_names_change_what_is_generated"
_CTX = "tests/unit/engine/test_llama_params.py::test_context_parameters_reach_a_real_context"

ENTRIES: tuple[Entry, ...] = (
    # ----- T1: per request, no teardown ------------------------------------------------------
    _p("n_predict", T1, "n_predict", "tests/unit/wire/test_openai.py::test_n_predict_as_limit"),
    _p("sampling.seed", T1, "seed", f"{_T}::test_completions_stop_and_seed"),
    _r("sampling.n_prev", T1, "the sampler's token history is sized by the engine (repeat_last_n tokens)"),
    _q("sampling.n_probs", T1, "n_probs (/completion) or logprobs/top_logprobs (OpenAI)"),
    _r("sampling.min_keep", T1, "hydrad's samplers always keep at least one token; min_keep is not served (a request's is refused too)"),
    _p("sampling.top_k", T1, "top_k", "tests/integration/test_sampling.py::test_top_k_preselection_samples_what_the_full_chain_samples"),
    _p("sampling.top_p", T1, "top_p", _SAMPLING),
    _p("sampling.min_p", T1, "min_p", _SAMPLING),
    _r("sampling.xtc_probability", T1, NO_SAMPLER),
    _r("sampling.xtc_threshold", T1, NO_SAMPLER),
    _r("sampling.typ_p", T1, NO_SAMPLER, also=("typical_p",)),
    _p("sampling.temp", T1, "temperature", "tests/integration/test_sampling.py::test_top_k_preselection_samples_what_the_full_chain_samples"),
    _r("sampling.dynatemp_range", T1, NO_SAMPLER, also=("dynatemp",)),
    _r("sampling.dynatemp_exponent", T1, NO_SAMPLER),
    _p("sampling.penalty_last_n", T1, "repeat_last_n", _SAMPLING),
    _p("sampling.penalty_repeat", T1, "repeat_penalty", "tests/integration/test_engine_hostile.py::test_repeat_penalty_changes_greedy_output"),
    _q("sampling.penalty_freq", T1, "frequency_penalty", also=("frequency_penalty",)),
    _q("sampling.penalty_present", T1, "presence_penalty", also=("presence_penalty",)),
    _r("sampling.dry_multiplier", T1, NO_SAMPLER),
    _r("sampling.dry_base", T1, NO_SAMPLER),
    _r("sampling.dry_allowed_length", T1, NO_SAMPLER),
    _r("sampling.dry_penalty_last_n", T1, NO_SAMPLER),
    _r("sampling.dry_sequence_breakers", T1, NO_SAMPLER),
    _r("sampling.adaptive_target", T1, NO_SAMPLER),
    _r("sampling.adaptive_decay", T1, NO_SAMPLER),
    _r("sampling.mirostat", T1, NO_SAMPLER),
    _r("sampling.mirostat_tau", T1, NO_SAMPLER),
    _r("sampling.mirostat_eta", T1, NO_SAMPLER),
    _r("sampling.top_n_sigma", T1, NO_SAMPLER),
    _q("sampling.ignore_eos", T1, "ignore_eos"),
    _fx("sampling.no_perf", T1, False, "hydrad reports timings in every answer and in /metrics; they cannot be turned off"),
    _q("sampling.timing_per_token", T1, "timings_per_token (a stream's every piece carries the timings so far)"),
    _r("sampling.user_sampling_config", T1, SAMPLER_STATE),
    _q("sampling.grammar", T1, "grammar, json_schema or response_format"),
    _r("sampling.grammar_lazy", T1, "lazy grammars are not served: a grammar constrains the whole answer (a request's grammar_lazy is refused too)"),
    _r("sampling.grammar_triggers", T1, "lazy grammars are not served, so there is nothing to trigger (a request's grammar_triggers is refused too)"),
    _r("sampling.preserved_tokens", T1, "lazy grammars are not served (a request's preserved_tokens is refused too)"),
    _q("sampling.logit_bias", T1, "logit_bias"),
    _r("sampling.logit_bias_eog", T1, SAMPLER_STATE),
    _r("sampling.samplers", T1, "hydrad's sampler order is fixed (a request's samplers is refused too)"),
    _r("sampling.generation_prompt", T1, SAMPLER_STATE),
    _p("sampling.reasoning_budget_tokens", T1, "reasoning_budget", "tests/integration/test_reasoning.py::test_engine_reasoning"),
    _r("sampling.reasoning_budget_start", T1, SAMPLER_STATE),
    _r("sampling.reasoning_budget_end", T1, SAMPLER_STATE),
    _r("sampling.reasoning_budget_forced", T1, SAMPLER_STATE),
    _r("sampling.reasoning_budget_message", T1, "a thinking budget ends with </think> written for the model, never a message (a request's is refused too)"),
    _r("sampling.reasoning_control", T1, "a request cannot end thinking while it runs (a request's reasoning_control is refused too)"),
    _r("sampling.backend_sampling", T1, "hydrad samples on the CPU"),
    _p("n_keep", T1, "n_keep", "tests/integration/test_context_shift.py::test_a_shifting_generation_runs_past_the_context_and_keeps_the_prompts_head"),
    _r("n_chunks", T1, "llama-perplexity's count of chunks of an input file; a daemon reads no input file"),
    _r("n_print", T1, TERMINAL),
    _q("antiprompt", T1, "stop", also=("reverse_prompt", "stop")),
    _r("prompt_cache_all", T1, NO_PROMPT_FILE),
    _r("prompt_cache_ro", T1, NO_PROMPT_FILE),
    _r("path_prompt_cache", T1, NO_PROMPT_FILE, also=("prompt_cache",)),
    _p("cache_prompt", T1, "cache_prompt", "tests/integration/test_coordinator.py::test_cache_prompt_reaches_the_engine_through_the_front_door"),
    _r("cache_idle_slots", T1, "hydrad keeps no prompt cache in host memory (a pool's Store keeps prefixes)"),
    _p("n_cache_reuse", T1, "n_cache_reuse", "tests/integration/test_context_shift.py::test_cache_reuse_moves_the_chunks_a_new_prompt_repeats", also=("cache_reuse",)),
    _r("n_ctx_checkpoints", T1, NO_CHECKPOINTS),
    _r("checkpoint_min_step", T1, NO_CHECKPOINTS),
    _p("cache_ram_mib", T1, "cache_ram_mib", "tests/integration/test_ram_cache.py::test_an_overwritten_conversation_comes_back_from_host_memory", also=("cache_ram",)),
    _r("slot_prompt_similarity", T1, "hydrad picks the slot with the longest cached prefix; there is no similarity threshold"),
    _r("single_turn", T1, TERMINAL),
    _fx("cont_batching", T1, True, "continuous batching is always on"),
    _p("ctx_shift", T1, "ctx_shift", "tests/integration/test_context_shift.py::test_a_shifting_generation_runs_past_the_context_and_keeps_the_prompts_head", also=("context_shift",)),
    _q("input_prefix", T1, "input_prefix (/infill)"),
    _q("input_suffix", T1, "input_suffix (/infill)"),
    _r("input_prefix_bos", T1, TERMINAL, also=("input_bos",)),
    _q("prompt", T1, "prompt or messages"),
    _r("system_prompt", T1, "a chat's system message is the request's own (messages)"),
    _r("prompt_file", T1, "llama-cli reads a prompt from a file; a request carries its prompt"),
    _r("api_keys", T1, "API keys are read at start (http api keys, llama-server's --api-key-file): change them and restart the engine"),
    _p("chat_template", T1, "chat_template", "tests/integration/test_configure_in_force.py::test_a_request_right_after_a_chat_template_configure_uses_it"),
    _r("use_jinja", T1, "hydrad decides: a chat without tools is rendered by llama.cpp's formatter, one with tools by the jinja template"),
    _fx("enable_chat_template", T1, True, "a chat is always rendered with a template"),
    _fx("force_pure_content_parser", T1, False, "tool calls are always parsed from the answer"),
    _p("default_template_kwargs", T1, "default_template_kwargs", "tests/integration/test_reasoning.py::test_engine_reasoning", also=("chat_template_kwargs",)),
    _p("reasoning_format", T1, "reasoning_format", "tests/integration/test_reasoning.py::test_engine_reasoning"),
    _r("enable_reasoning", T1, "use reasoning_budget: 0 renders the template without thinking, -1 leaves it to the template"),
    _p("reasoning_budget", T1, "reasoning_budget", "tests/integration/test_reasoning.py::test_engine_reasoning"),
    _fx("prefill_assistant", T1, False, "a chat's last assistant message is a whole message and the answer a new turn"),
    _p("embedding", T1, "embeddings", "tests/integration/test_embeddings.py::test_without_embeddings_it_says_how_to_turn_them_on"),
    _q("embd_normalize", T1, "embd_normalize (/embedding)"),
    _r("embd_out", T1, TOOL_OUTPUT),
    _r("embd_sep", T1, TOOL_OUTPUT),
    _r("cls_sep", T1, TOOL_OUTPUT),
    _r("image", T1, NO_MULTIMODAL),
    _r("image_min_tokens", T1, NO_MULTIMODAL),
    _r("image_max_tokens", T1, NO_MULTIMODAL),
    _r("timeout_read", T1, START_ONLY + " (http.header_timeout_s, llama-server's --timeout)"),
    _r("timeout_write", T1, START_ONLY + " (http.header_timeout_s, llama-server's --timeout)"),
    _r("sse_ping_interval", T1, "hydrad sends no keep-alive pings in its streams"),
    _p("sleep_idle_seconds", T1, "sleep_idle_seconds", "tests/integration/test_sleep_idle.py::test_engine_sleeps_frees_the_model_and_wakes_for_a_request"),
    _r("logits_file", T1, TOOL_OUTPUT),
    _r("logits_output_dir", T1, TOOL_OUTPUT),
    _r("save_logits", T1, TOOL_OUTPUT),
    _r("tensor_filter", T1, TOOL_OUTPUT),
    _r("out_file", T1, TOOL_OUTPUT),
    _r("load_progress_callback", T1, "a C callback; hydrad reports a load's progress in /health and its heartbeat itself"),
    _r("interactive", T1, TERMINAL),
    _r("interactive_first", T1, TERMINAL),
    _r("multiline_input", T1, TERMINAL),
    _r("simple_io", T1, TERMINAL),
    _r("use_color", T1, TERMINAL),
    _r("display_prompt", T1, TERMINAL),
    _r("verbose_prompt", T1, TERMINAL),
    _r("conversation_mode", T1, TERMINAL),
    _r("escape", T1, TERMINAL),
    _r("show_timings", T1, TERMINAL),
    # ----- T2: rebuild the context -----------------------------------------------------------
    _p("n_ctx", T2, "n_ctx", "tests/integration/test_engine_daemon.py::test_configure_tiers"),
    _p("n_batch", T2, "n_batch", f"{_T}::test_a_burst_of_prompts_is_prefilled_one_ubatch_per_step"),
    _p("n_ubatch", T2, "n_ubatch", f"{_T}::test_a_burst_of_prompts_is_prefilled_one_ubatch_per_step"),
    _p("n_parallel", T2, "n_parallel", _CTX),
    _r("n_sequences", T2, "llama-parallel's count of sequences (an example program); the engine's slots are n_parallel"),
    _r("n_outputs_max", T2, "the engine asks llama.cpp for the logits of the rows it samples, no more"),
    _r("grp_attn_n", T2, "self-extend (group attention) is llama-cli's, not llama-server's; size the context with n_ctx and RoPE scaling"),
    _r("grp_attn_w", T2, "self-extend (group attention) is llama-cli's, not llama-server's; size the context with n_ctx and RoPE scaling"),
    _p("cpuparams.n_threads", T2, "n_threads", "tests/unit/engine/test_load_threads.py::test_an_installed_generation_gets_its_own_threads_back"),
    _r("cpuparams.cpumask", T2, AFFINITY, also=("cpu_mask",)),
    _r("cpuparams.strict_cpu", T2, AFFINITY, also=("cpu_strict",)),
    _r("cpuparams.priority", T2, "hydrad runs at the priority it is started with: set systemd's Nice= instead", also=("prio",)),
    _fx("cpuparams.poll", T2, 50, "hydrad's threads poll as llama.cpp's do by default (50)"),
    _p("cpuparams_batch.n_threads", T2, "n_threads_batch", _CTX),
    _r("cpuparams_batch.cpumask", T2, AFFINITY, also=("cpu_mask_batch",)),
    _r("cpuparams_batch.strict_cpu", T2, AFFINITY, also=("cpu_strict_batch",)),
    _r("cpuparams_batch.priority", T2, "hydrad runs at the priority it is started with: set systemd's Nice= instead", also=("prio_batch",)),
    _r("cpuparams_batch.poll", T2, "hydrad's threads poll as llama.cpp's do by default (50)", also=("poll_batch",)),
    _r("numa", T2, "hydrad makes no NUMA placement: bind the unit to a node with systemd's NUMAPolicy="),
    _p("rope_freq_base", T2, "rope_freq_base", _CTX),
    _p("rope_freq_scale", T2, "rope_freq_scale", _CTX),
    _p("yarn_ext_factor", T2, "yarn_ext_factor", _CTX),
    _p("yarn_attn_factor", T2, "yarn_attn_factor", _CTX),
    _p("yarn_beta_fast", T2, "yarn_beta_fast", _CTX),
    _p("yarn_beta_slow", T2, "yarn_beta_slow", _CTX),
    _p("yarn_orig_ctx", T2, "yarn_orig_ctx", _CTX),
    _p("rope_scaling_type", T2, "rope_scaling", _CTX),
    _p("pooling_type", T2, "pooling", "tests/integration/test_embeddings.py::test_pooling_none_gives_token_vectors"),
    _r("attention_type", T2, "the engine attends as the model says (causal for generation); embeddings use the model's pooling"),
    _p("flash_attn_type", T2, "flash_attn", _CTX),
    _p("cache_type_k", T2, "cache_type_k", _CTX),
    _p("cache_type_v", T2, "cache_type_v", _CTX),
    _p("kv_unified", T2, "kv_unified", _CTX),
    _fx("swa_full", T2, True, "a sliding-window model's KV cache is always full-size, so prefixes stay reusable"),
    _fx("no_perf", T2, False, "hydrad reports timings in every answer and in /metrics; they cannot be turned off"),
    _fx("no_kv_offload", T2, False, "the KV cache always lives on the device of its layers"),
    _fx("no_op_offload", T2, False, "host tensor operations are always offloaded"),
    _fx("no_extra_bufts", T2, False, "llama.cpp may always repack weights into its extra buffer types"),
    _p("no_host", T2, "no_host", "tests/unit/engine/test_llama_params.py::test_no_host_reaches_the_model_params_of_a_real_load"),
    _p("spec_type", T2, "spec_type", "tests/integration/test_speculative.py::test_greedy_copy_same_answer_fewer_steps", also=("speculative.types", "speculative.type")),
    _p("spec_n_min", T2, "spec_n_min", "tests/integration/test_speculative.py::test_greedy_copy_same_answer_fewer_steps", also=("n_min", "draft_min", "speculative.n_min")),
    _p("spec_n_max", T2, "spec_n_max", "tests/integration/test_speculative.py::test_greedy_copy_same_answer_fewer_steps", also=("n_max", "draft_max", "speculative.n_max")),
    _p("spec_p_min", T2, "spec_p_min", "tests/integration/test_draft_model.py::test_greedy_answer_is_the_plain_one_with_a_draft_model", also=("p_min", "draft_p_min", "speculative.p_min")),
    _r("cb_eval", T2, "a C callback (llama.cpp calls it for every tensor computed): a payload cannot carry one"),
    # ----- T3: reload the model --------------------------------------------------------------
    _p("model", T3, "model", f"{_T}::test_configure_tiers"),
    _p("mmproj", T3, "mmproj", "tests/integration/test_images.py::test_images_through_chat_and_completion"),
    _p("n_gpu_layers", T3, "n_gpu_layers", "tests/integration/test_model_overrides.py::test_register_reports_the_weights_a_load_keeps_in_host_memory"),
    _p("main_gpu", T3, "main_gpu"),
    _p("tensor_split", T3, "tensor_split", "tests/integration/test_combine.py::test_expert_mode_is_refused_while_decoding_and_for_dense_models"),
    _p("split_mode", T3, "split_mode", _CTX),
    _p("devices", T3, "devices", "tests/unit/engine/test_model_overrides.py::test_devices_is_a_runtime_field_and_none_alone_means_no_device"),
    _p("use_mmap", T3, "use_mmap", "tests/unit/engine/test_llama_params.py::test_use_mmap_decides_how_llama_cpp_reads_the_model"),
    _p("use_direct_io", T3, "use_direct_io", "tests/integration/test_model_overrides.py::test_the_load_mode_follows_use_mlock_and_use_direct_io"),
    _p("use_mlock", T3, "use_mlock", "tests/integration/test_model_overrides.py::test_the_load_mode_follows_use_mlock_and_use_direct_io"),
    _p("check_tensors", T3, "check_tensors", "tests/integration/test_model_overrides.py::test_check_tensors_refuses_a_nan_expert"),
    _r("no_alloc", T3, "llama.cpp's load that allocates no buffers (a tool's dry run); hydrad estimates a load's memory from the GGUF itself"),
    _p("kv_overrides", T3, "kv_overrides", "tests/integration/test_model_overrides.py::test_kv_overrides_change_what_llama_cpp_reads"),
    _p("tensor_buft_overrides", T3, "override_tensors", "tests/integration/test_model_overrides.py::test_n_cpu_moe_and_explicit_overrides_place_the_experts"),
    _p("lora_init_without_apply", T3, "lora_init_without_apply", "tests/integration/test_lora.py::test_scales_change_answers_without_a_reload"),
    _p("lora_adapters", T3, "lora_adapters", "tests/integration/test_lora.py::test_scales_change_answers_without_a_reload", also=("lora",)),
    _p("control_vectors", T3, "control_vectors", "tests/integration/test_lora.py::test_a_control_vector_changes_answers_and_at_scale_0_does_not", also=("control_vector",)),
    _p("rpc_servers", T3, "rpc_servers", "tests/integration/test_combine.py::test_expert_mode_is_refused_while_decoding_and_for_dense_models"),
    _p("n_cpu_moe", T3, "n_cpu_moe", "tests/integration/test_model_overrides.py::test_n_cpu_moe_and_explicit_overrides_place_the_experts"),
    _p("speculative.model", T3, "spec_draft_model", "tests/integration/test_draft_model.py::test_greedy_answer_is_the_plain_one_with_a_draft_model", also=("model_draft", "draft_model")),
    _p("speculative.n_gpu_layers", T3, "spec_draft_n_gpu_layers", also=("n_gpu_layers_draft",)),
    _p("speculative.n_ctx", T3, "spec_draft_n_ctx", "tests/integration/test_draft_model.py::test_greedy_answer_is_the_plain_one_with_a_draft_model", also=("n_ctx_draft",)),
    _r("speculative.cache_type_k", T3, DRAFT_KV, also=("cache_type_k_draft",)),
    _r("speculative.cache_type_v", T3, DRAFT_KV, also=("cache_type_v_draft",)),
    _r("speculative.devices", T3, DRAFT_KV, also=("device_draft",)),
    # ----- T4: process restart (refused at runtime) -----------------------------------------
    _r("hostnames", T4, START_ONLY + " (http.host)"),
    _r("port", T4, START_ONLY + " (http.port)"),
    _r("reuse_port", T4, "hydrad binds its port alone"),
    _r("n_threads_http", T4, "hydrad's HTTP server is one event loop: no request waits for a thread", also=("threads_http",)),
    _r("verbosity", T4, START_ONLY + " (logging.level)"),
    _r("log_json", T4, START_ONLY + " (logging); hydrad's log lines are key=value"),
    _r("ssl_file_key", T4, "hydrad speaks plain HTTP: put TLS in a proxy in front", also=("ssl_key_file",)),
    _r("ssl_file_cert", T4, "hydrad speaks plain HTTP: put TLS in a proxy in front", also=("ssl_cert_file",)),
    _r("device", T4, START_ONLY + " (device: which GPUs the process may see)"),
)

BY_NAME: dict[str, Entry] = {e.name: e for e in ENTRIES}


def _payload_keys() -> dict[str, Entry]:
    """Every key a flat payload may name a refused or fixed field by: its contract name, the part after
    the last dot, and its other spellings, unless that key names a carried field (``n_ctx`` is the
    engine's context, not the draft model's)."""
    taken = {k for e in ENTRIES if e.param is not None for k in (e.param, e.name, e.short, *e.also)}
    refused = [e for e in ENTRIES if e.refused]
    out: dict[str, Entry] = {e.name: e for e in refused if e.name not in taken}  # a full name first
    for e in refused:
        for key in (e.short, *e.also):
            if key not in taken:
                out.setdefault(key, e)
    return out


_KEYS: dict[str, Entry] | None = None


def refused_key(key: str) -> Entry | None:
    """The refused (or fixed) contract field a payload key names, or None."""
    global _KEYS
    if _KEYS is None:
        _KEYS = _payload_keys()
    return _KEYS.get(key)


def refusal(key: str, value: Any = None) -> str | None:
    """Why a runtime payload may not set ``key`` to ``value`` ("``key``: reason"); None when it may (a
    runtime parameter, a fixed field at its value, or a name the contract does not know)."""
    e = refused_key(key)
    if e is None or (e.fixed is not None and value == e.fixed and type(value) is type(e.fixed)):
        return None
    if e.fixed is not None:
        return f"{key}: only {_json(e.fixed)} is accepted: {e.reason}"
    return f"{key}: {e.reason}"


def drop_fixed(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` without the fixed fields given at the value the engine always uses (they change
    nothing); raises ValueError naming the first refused field with its reason."""
    out = {}
    for k, v in values.items():
        e = refused_key(k)
        if e is None:
            out[k] = v
            continue
        why = refusal(k, v)
        if why is not None:
            raise RefusedParam(k, why)
    return out


def without_fixed(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` without the fixed fields given at the value the engine always uses; anything else is
    left for validation to refuse (naming the reason: see ``params.validation_message``)."""
    drop = [k for k in values if refused_key(k) is not None and refusal(k, values[k]) is None]
    return {k: v for k, v in values.items() if k not in drop} if drop else values


def request_reason(field: str) -> str | None:
    """The reason a per-request field is not served, when the contract has one (the doors name it)."""
    e = refused_key(field)
    if e is None or e.request is not None or e.reason is None:
        return None
    return re.sub(r" \(a request[^)]*\)$", "", e.reason)  # said to a request: "refused too" is this


class RefusedParam(ValueError):
    """A payload naming a contract field the engine refuses; ``field`` is the key as given."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _json(value: Any) -> str:
    return "true" if value is True else "false" if value is False else repr(value)
