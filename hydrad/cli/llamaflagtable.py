"""Every flag of llama-server, and what ``hydrad`` does with it (:mod:`hydrad.cli.llamaflags` reads
the command line with this table): the converters of the mapped flags' values, then the table,
kind by kind."""

from __future__ import annotations

from typing import Any, Callable


from hydrad.cli.llamaflagtypes import Apply, CommandLine, Flag, FlagError, Path_, State
from hydrad.cli.llamaflagvalues import (
    absolute as _absolute, adapters as _adapters, api_key as _api_key, api_key_file as _api_key_file,
    device_action as _device, file_value, float_value as _float, int_value as _int, layer_range as _layer_range,
    list_value as _list, verbosity as _verbosity,
)

# ----- value converters ------------------------------------------------------------------------------

_TRUE = ("on", "enabled", "true", "1")
_FALSE = ("off", "disabled", "false", "0")
_AUTO = ("auto", "-1")


def _param(name: str, convert: Callable[[str, str], Any] | None = None) -> Apply:
    """A flag that sets runtime parameter ``name`` (the YAML's ``defaults.NAME``)."""
    def apply(cl: CommandLine, _: State, flag: str, value: Any) -> None:
        cl.set(("defaults", name), convert(flag, value) if convert is not None else value, flag)
    return apply


def _const(path: Path_, const: Any) -> Apply:
    def apply(cl: CommandLine, _: State, flag: str, value: Any) -> None:
        cl.set(path, const, flag)
    return apply


def _setting(path: Path_, convert: Callable[[str, str], Any] | None = None) -> Apply:
    """A flag that sets a start-only setting (``http.port``)."""
    def apply(cl: CommandLine, _: State, flag: str, value: Any) -> None:
        cl.set(path, convert(flag, value) if convert is not None else value, flag)
    return apply


def _threads(flag: str, value: str) -> int:
    n = _int(flag, value)
    return 0 if n == -1 else n  # llama-server's -1: as many as the machine has; hydrad's 0: every usable CPU


def _predict(flag: str, value: str) -> int:
    n = _int(flag, value)
    return -1 if n == -2 else n  # -2: until the context is full, which is what -1 does here


def _spec_type(flag: str, value: str) -> str:
    kinds = _list(value)
    named = {"none": "none", "ngram-simple": "ngram", "ngram-mod": "ngram-mod", "draft-simple": "draft"}
    if len(kinds) == 1 and kinds[0] in named:
        return named[kinds[0]]
    raise FlagError(f"{flag}: hydrad speculates by one kind at a time: ngram-simple, ngram-mod, draft-simple (with "
                    f"--spec-draft-model) or none, not {value!r}")


def _gpu_layers(flag: str, value: str) -> int:
    if value in ("auto", "all"):
        return -1
    return _int(flag, value)


def _flash(flag: str, value: str) -> str:
    v = value.lower()
    if v in _TRUE:
        return "on"
    if v in _FALSE:
        return "off"
    if v in _AUTO:
        return "auto"
    raise FlagError(f"{flag}: on, off or auto, got {value!r}")


def _split_mode(flag: str, value: str) -> str:
    if value == "tensor":
        raise FlagError(f"{flag}: 'tensor' is not served: hydrad splits a model across devices by layer or by "
                        "row (none, layer, row)")
    return value


def _tensor_split(flag: str, value: str) -> list[float]:
    parts = [p for p in value.replace("/", ",").split(",") if p.strip()]
    return [_float(flag, p) for p in parts]


def _rerank(cl: CommandLine, _: State, flag: str, value: Any) -> None:
    """llama-server's --reranking: embeddings on, rank pooling."""
    cl.set(("defaults", "embeddings"), True, flag)
    cl.set(("defaults", "pooling"), "rank", flag)


def _rope_scale(flag: str, value: str) -> float:
    n = _float(flag, value)
    if n <= 0:
        raise FlagError(f"{flag}: needs a number above 0, got {value!r}")
    return 1.0 / n


def _parallel(cl: CommandLine, _: State, flag: str, value: Any) -> None:
    n = _int(flag, value)
    if n != -1:  # -1: llama-server's "auto", 4 slots with a unified cache: hydrad's default
        cl.set(("defaults", "n_parallel"), n, flag)
        # A count given is llama-server's cue for a KV buffer per slot (n_ctx / N each) unless -kvu says
        # otherwise, before or after this flag: the same command line gives each slot the same room.
        if cl.get(("defaults", "kv_unified")) is None:
            cl.set(("defaults", "kv_unified"), False, flag)


def _reasoning(cl: CommandLine, _: State, flag: str, value: Any) -> None:
    """llama-server's --reasoning: on or off sets the template's ``enable_thinking`` for every chat
    (``defaults.default_template_kwargs``; a request's ``chat_template_kwargs`` still overrides it),
    auto leaves it to the template (a jinja render is given ``enable_thinking: true``)."""
    v = value.lower()
    if v in _TRUE or v in _FALSE:
        kwargs = dict(cl.get(("defaults", "default_template_kwargs")) or {})
        kwargs["enable_thinking"] = v in _TRUE
        cl.set(("defaults", "default_template_kwargs"), kwargs, flag)
    elif v not in ("auto",):
        raise FlagError(f"{flag}: on, off or auto, got {value!r}")


def _load_mode(cl: CommandLine, _: State, flag: str, value: Any) -> None:
    if value in ("auto", "mmap"):
        cl.set(("defaults", "use_mmap"), True, flag)
    elif value == "none":
        cl.set(("defaults", "use_mmap"), False, flag)
    else:
        raise FlagError(f"{flag}: '{value}' is not served: hydrad maps the model (auto, mmap) or reads it (none), "
                        "and never locks it in memory or reads it with direct I/O")


def _override(cl: CommandLine, _: State, flag: str, value: Any) -> None:
    current = list(cl.get(("defaults", "override_tensors")) or [])
    cl.set(("defaults", "override_tensors"), current + _list(value), flag)


def _chat_template_file(cl: CommandLine, _: State, flag: str, value: Any) -> None:
    p = file_value(flag, value)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FlagError(f"{flag}: cannot read {value}: {exc}") from None
    cl.set(("defaults", "chat_template"), text, flag)


def _model(cl: CommandLine, state: State, flag: str, value: Any) -> None:
    state.model = (flag, value)


def _alias(cl: CommandLine, state: State, flag: str, value: Any) -> None:
    names = _list(value)
    if not names:
        raise FlagError(f"{flag}: needs at least one name")
    state.aliases = (flag, names)


def _host(flag: str, value: str) -> str:
    if "," in value or value.endswith(".sock"):
        raise FlagError(f"{flag}: one address only (hydrad listens on one TCP address, never a UNIX socket)")
    return value


def _path(flag: str, value: str) -> str:
    return str(_absolute(value))


def _m(names: str, metavar: str | None, help: str, apply: Apply, optional: str | None = None) -> Flag:
    return Flag(tuple(names.split()), metavar, help, "mapped", apply, optional=optional)


def _a(names: str, metavar: str | None, why: str, optional: str | None = None) -> Flag:
    return Flag(tuple(names.split()), metavar, why, "accepted", optional=optional)


def _n(names: str, metavar: str, neutral: str, why: str, optional: str | None = None) -> Flag:
    return Flag(tuple(names.split()), metavar, why, "neutral", neutral=tuple(neutral.split()), optional=optional)


def _r(names: str, metavar: str | None, why: str) -> Flag:
    return Flag(tuple(names.split()), metavar, why, "refused")


NO_SPECULATIVE = ("hydrad speculates by n-gram lookup (--spec-type ngram-simple, ngram-mod) or a draft model "
                  "(draft-simple) on the model's devices and threads, with no other settings")
NO_MULTIMODAL = "hydrad takes images through a local projector file (--mmproj) only: no audio or video, no downloads"
NO_DOWNLOAD = "hydrad loads local GGUF files only: fetch the file, then pass it with -m"
NO_ROUTER = "several models are a pool's work: run one hydrad per model and a hydra-coordinator in front"
AFFINITY = "hydrad runs on the CPUs it is given: set them with systemd's CPUAffinity= (or taskset)"
PER_REQUEST = "a request sets it (hydrad has no server-wide default for it)"
NO_SAMPLER = "hydrad has no such sampler (a request setting it is refused too)"
INERT = "it tunes a sampler hydrad does not have (refused unless off), so it changes nothing"
NO_CHECKPOINTS = "hydrad makes no context checkpoints"

MAPPED: tuple[Flag, ...] = (
    _m("-m --model", "FNAME", "the GGUF file to serve, a path (no registry entry needed): defaults.model",
       _model),
    _m("-a --alias", "STRING", "names the model answers to, comma-separated; the first is its id in /v1/models "
       "and answers (a registry entry's key and aliases)", _alias),
    _m("--host", "HOST", "the address HTTP binds: http.host", _setting(("http", "host"), _host)),
    _m("--port", "PORT", "HTTP port: http.port", _setting(("http", "port"), _int)),
    _m("-to --timeout", "N", "seconds a connection may take to send a request, and stay idle between two: "
       "http.header_timeout_s", _setting(("http", "header_timeout_s"), _float)),
    _m("--api-key", "KEY", "API key(s), comma-separated: the inference endpoints need one (several keys: one "
       "tenant each, with a prompt cache of its own)", _api_key),
    _m("--api-key-file", "FNAME", "file of API keys, one a line, # for comments (as --api-key)", _api_key_file),
    _m("--cors-origins", "ORIGINS", "web origins allowed to call the inference endpoints from a browser, "
       "comma-separated (scheme://host[:port], localhost for every loopback origin, or *): http.cors_origins",
       _setting(("http", "cors_origins"), lambda f, v: _list(v))),
    _m("--slot-save-path", "PATH", "directory of slot files (POST /slots/{id}?action=save|restore): "
       "slot_save_dir", _setting(("slot_save_dir",), _path)),
    _m("-dev --device", "<dev1,dev2,..>", "the GPUs to use, CUDA0,CUDA1,...: device", _device),
    _m("--slots", None, "serve GET /slots (the default): http.slots_endpoint",
       _const(("http", "slots_endpoint"), True)),
    _m("--no-slots", None, "GET /slots answers 501: http.slots_endpoint false",
       _const(("http", "slots_endpoint"), False)),
    _m("-v --verbose --log-verbose", None, "log everything (logging.level debug)",
       _const(("logging", "level"), "debug")),
    _m("-lv --verbosity --log-verbosity", "N", "log threshold: 0-1 errors, 2 warnings, 3 info, 4-5 debug "
       "(logging.level)", _verbosity),
    _m("-c --ctx-size", "N", "context size in tokens, shared by the slots; 0 = the model's: defaults.n_ctx",
       _param("n_ctx", _int)),
    _m("-n --predict --n-predict", "N", "tokens to predict when a request sets none; -1 (or -2) = until the "
       "context is full: defaults.n_predict", _param("n_predict", _predict)),
    _m("-b --batch-size", "N", "logical batch: defaults.n_batch", _param("n_batch", _int)),
    _m("-ub --ubatch-size", "N", "physical batch: defaults.n_ubatch", _param("n_ubatch", _int)),
    _m("--spec-type", "TYPE", "speculative decoding: ngram-simple, ngram-mod (prompt lookup), draft-simple (a draft "
       "model) or none; one kind, others are refused: defaults.spec_type", _param("spec_type", _spec_type)),
    _m("--spec-ngram-simple-size-n --spec-ngram-mod-n-match", "N", "tokens of the n-gram looked up: "
       "defaults.spec_ngram_size", _param("spec_ngram_size", _int)),
    _m("--spec-ngram-simple-size-m --spec-draft-n-max --spec-ngram-mod-n-max", "N", "most tokens drafted per step: "
       "defaults.spec_n_max", _param("spec_n_max", _int)),
    _m("--spec-draft-n-min --spec-ngram-mod-n-min", "N", "shortest draft decoded: defaults.spec_n_min",
       _param("spec_n_min", _int)),
    _m("--spec-draft-p-min --draft-p-min", "P", "a draft model's draft stops before a token it gives less "
       "probability: defaults.spec_p_min", _param("spec_p_min", _float)),
    _m("--spec-draft-model -md --model-draft", "FNAME", "the draft model of draft-simple: defaults.spec_draft_model",
       _param("spec_draft_model", _path)),
    _m("--spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft", "N", "the draft model's layers on the GPU: "
       "defaults.spec_draft_n_gpu_layers", _param("spec_draft_n_gpu_layers", _gpu_layers)),
    _m("-np --parallel", "N", "slots (requests decoded together), each with n_ctx / N of the context unless -kvu; "
       "-1 = the default, 4 sharing one KV pool: defaults.n_parallel (and defaults.kv_unified false)",
       _parallel),
    _m("-t --threads", "N", "CPU threads for generation; -1 = every usable CPU: defaults.n_threads",
       _param("n_threads", _threads)),
    _m("-tb --threads-batch", "N", "CPU threads for prompts; -1 = every usable CPU: defaults.n_threads_batch",
       _param("n_threads_batch", _threads)),
    _m("-ngl --gpu-layers --n-gpu-layers", "N", "layers on the GPU, a number, 'all' or 'auto' (both: every "
       "layer): defaults.n_gpu_layers", _param("n_gpu_layers", _gpu_layers)),
    _m("-sm --split-mode", "{none,layer,row}", "how the model is split across GPUs: defaults.split_mode",
       _param("split_mode", _split_mode)),
    _m("-ts --tensor-split", "N0,N1,...", "share of the model on each GPU: defaults.tensor_split",
       _param("tensor_split", _tensor_split)),
    _m("-mg --main-gpu", "INDEX", "the GPU for the whole model (split-mode none): defaults.main_gpu",
       _param("main_gpu", _int)),
    _m("-ot --override-tensor", "PATTERN=TYPE,...", "tensor placement overrides, as llama.cpp's: "
       "defaults.override_tensors", _override),
    _m("-fa --flash-attn", "on|off|auto", "flash attention (without a value: on): defaults.flash_attn",
       _param("flash_attn", _flash), optional="on"),
    _m("-ctk --cache-type-k", "TYPE", "data type of the K cache: defaults.cache_type_k", _param("cache_type_k")),
    _m("-ctv --cache-type-v", "TYPE", "data type of the V cache: defaults.cache_type_v", _param("cache_type_v")),
    _m("-kvu --kv-unified", None, "one KV buffer for every slot: defaults.kv_unified",
       _const(("defaults", "kv_unified"), True)),
    _m("-no-kvu --no-kv-unified", None, "a KV buffer per slot: defaults.kv_unified false",
       _const(("defaults", "kv_unified"), False)),
    _m("--mmap", None, "map the model file: defaults.use_mmap", _const(("defaults", "use_mmap"), True)),
    _m("--no-mmap", None, "read the model into memory instead of mapping it: defaults.use_mmap false",
       _const(("defaults", "use_mmap"), False)),
    _m("-lm --load-mode", "MODE", "auto or mmap (map the file), none (read it): defaults.use_mmap", _load_mode),
    _m("--no-host", None, "weights that stay on the CPU in ordinary memory: defaults.no_host",
       _const(("defaults", "no_host"), True)),
    _m("--embedding --embeddings", None, "serve /v1/embeddings and /embedding: defaults.embeddings (hydrad "
       "serves completions beside them)", _const(("defaults", "embeddings"), True)),
    _m("--pooling", "{none,mean,cls,last,rank}", "how an input's token vectors become its embedding (rank: a "
       "reranker's scores): defaults.pooling", _param("pooling")),
    _m("--rerank --reranking", None, "serve /rerank with a reranker model: defaults.embeddings true and "
       "defaults.pooling rank", _rerank),
    _m("--rope-scaling", "{none,linear,yarn}", "RoPE scaling type: defaults.rope_scaling", _param("rope_scaling")),
    _m("--rope-scale", "N", "RoPE context scaling factor (1/N is defaults.rope_freq_scale)",
       _param("rope_freq_scale", _rope_scale)),
    _m("--rope-freq-base", "N", "RoPE base frequency: defaults.rope_freq_base", _param("rope_freq_base", _float)),
    _m("--rope-freq-scale", "N", "RoPE frequency scale: defaults.rope_freq_scale",
       _param("rope_freq_scale", _float)),
    _m("--yarn-orig-ctx", "N", "YaRN original context: defaults.yarn_orig_ctx", _param("yarn_orig_ctx", _int)),
    _m("--yarn-ext-factor", "N", "YaRN extrapolation mix: defaults.yarn_ext_factor",
       _param("yarn_ext_factor", _float)),
    _m("--yarn-attn-factor", "N", "YaRN magnitude scaling: defaults.yarn_attn_factor",
       _param("yarn_attn_factor", _float)),
    _m("--yarn-beta-slow", "N", "YaRN high correction dimension: defaults.yarn_beta_slow",
       _param("yarn_beta_slow", _float)),
    _m("--yarn-beta-fast", "N", "YaRN low correction dimension: defaults.yarn_beta_fast",
       _param("yarn_beta_fast", _float)),
    _m("--temp --temperature", "N", "default temperature: defaults.temperature", _param("temperature", _float)),
    _m("--top-k", "N", "default top-k: defaults.top_k", _param("top_k", _int)),
    _m("--top-p", "N", "default top-p: defaults.top_p", _param("top_p", _float)),
    _m("--min-p", "N", "default min-p: defaults.min_p", _param("min_p", _float)),
    _m("--repeat-penalty", "N", "default repetition penalty: defaults.repeat_penalty",
       _param("repeat_penalty", _float)),
    _m("--repeat-last-n", "N", "tokens the repetition penalty looks at: defaults.repeat_last_n",
       _param("repeat_last_n", _int)),
    _m("-s --seed", "SEED", "default seed, -1 = random: defaults.seed", _param("seed", _int)),
    _m("--chat-template", "JINJA_TEMPLATE", "a built-in template's name (chatml, ...) or template text: "
       "defaults.chat_template", _param("chat_template")),
    _m("--chat-template-file", "JINJA_TEMPLATE_FILE", "template text from a file: defaults.chat_template",
       _chat_template_file),
    _m("-rea --reasoning", "on|off|auto", "whether the chat template is asked to think: on or off sets "
       "enable_thinking in defaults.default_template_kwargs, auto leaves it to the template",
       _reasoning),
    _m("--sleep-idle-seconds", "SECONDS", "free the model after this many seconds without a request; the next "
       "request loads it again (-1: never): defaults.sleep_idle_seconds", _param("sleep_idle_seconds", _int)),
    _m("-mm --mmproj", "FILE", "vision projector loaded with the model: defaults.mmproj",
       _param("mmproj", lambda flag, value: str(file_value(flag, value)))),
    _m("--lora", "FNAME", "LoRA adapter(s), comma-separated, at scale 1: defaults.lora_adapters",
       _adapters("lora_adapters", scaled=False)),
    _m("--lora-scaled", "FNAME:SCALE,...", "LoRA adapter(s) with their scales: defaults.lora_adapters",
       _adapters("lora_adapters", scaled=True)),
    _m("--lora-init-without-apply", None, "load the LoRA adapters at scale 0 until POST /lora-adapters or a "
       "request sets one: defaults.lora_init_without_apply", _const(("defaults", "lora_init_without_apply"), True)),
    _m("--control-vector", "FNAME", "control vector(s), comma-separated, at scale 1: defaults.control_vectors",
       _adapters("control_vectors", scaled=False)),
    _m("--control-vector-scaled", "FNAME:SCALE,...", "control vector(s) with their scales: "
       "defaults.control_vectors", _adapters("control_vectors", scaled=True)),
    Flag(("--control-vector-layer-range",), "START END", "the layers the control vectors apply to, both "
         "included: defaults.control_vector_layer_range", "mapped", _layer_range, nargs=2),
    _m("--cache-prompt", None, "reuse a slot's cached prefix: defaults.cache_prompt",
       _const(("defaults", "cache_prompt"), True)),
    _m("--no-cache-prompt", None, "never reuse a cached prefix: defaults.cache_prompt false",
       _const(("defaults", "cache_prompt"), False)),
    _m("--context-shift", None, "a generation that fills the context drops half of what follows the kept "
       "tokens and goes on: defaults.ctx_shift", _const(("defaults", "ctx_shift"), True)),
    _m("--no-context-shift", None, "a generation that fills the context ends (the default): defaults.ctx_shift "
       "false", _const(("defaults", "ctx_shift"), False)),
    _m("--keep", "N", "prompt tokens a context shift keeps, -1 = all: defaults.n_keep", _param("n_keep", _int)),
    _m("--cache-reuse", "N", "smallest chunk of a cached prompt reused by shifting its KV, 0 = off: "
       "defaults.n_cache_reuse", _param("n_cache_reuse", _int)),
    _m("-cram --cache-ram", "N", "host memory for the prompts of overwritten slots, MiB, 0 = off, -1 = no limit: "
       "defaults.cache_ram_mib", _param("cache_ram_mib", _int)),
)

ACCEPTED: tuple[Flag, ...] = (
    _a("--jinja", None, "a chat without tools is rendered by llama.cpp's formatter from the model's template, "
       "one with tools by the template itself (jinja); tools are always served"),
    _a("--no-jinja", None, "a chat without tools is rendered by llama.cpp's formatter, as with --no-jinja; tools "
       "are still served (rendered with the template)"),
    _a("-cb --cont-batching", None, "continuous batching is always on"),
    _m("--metrics", None, "serve GET /metrics (open like /health); a command line with -m and without it answers "
       "501 there, as llama-server does: http.metrics_endpoint", _const(("http", "metrics_endpoint"), True)),
    _m("--ui --webui", None, "serve the web chat page at / (the default): http.webui", _const(("http", "webui"), True)),
    _m("--no-webui --no-ui", None, "serve no web chat page at /: http.webui false", _const(("http", "webui"), False)),
    _a("--threads-http", "N", "hydrad's HTTP server is one event loop: no request waits for a thread"),
    _a("-kvo --kv-offload", None, "the KV cache is always on the device of its layers"),
    _a("--repack", None, "weights are always repacked where llama.cpp can"),
    _a("--op-offload", None, "host tensor operations are always offloaded"),
    _a("--warmup", None, "a model is always warmed up before it serves"),
    _a("--swa-full", None, "a sliding-window model's KV cache is always full-size (llama.cpp's own default; "
       "prefixes stay reusable)"),
    _a("--perf --no-perf", None, "hydrad reports its own timings (in answers and /metrics) either way"),
    _a("-e --escape --no-escape", None, "escapes in prompts given on the command line, which a server takes none of"),
    _a("-dt --defrag-thold", "N", "deprecated: llama.cpp ignores it too"),
    _a("--offline", None, "hydrad never downloads anything"),
    _a("--no-log-jsonl", None, "hydrad's log lines are key=value"),
    _a("--log-prefix", None, "every log line names its level"),
    _a("--log-timestamps", None, "every log line is timed (by journald under systemd)"),
    _a("--no-cors-credentials", None, "CORS never allows credentials here"),
    _a("-sps --slot-prompt-similarity", "SIMILARITY", "a speed knob of llama-server's slot choice; hydrad picks "
       "the slot with the longest cached prefix and answers the same"),
    _a("--cache-idle-slots --no-cache-idle-slots", None, "hydrad keeps no prompt cache in host memory"),
    _a("--no-prefill-assistant", None, "a chat's last assistant message is a whole message and the answer a new "
       "turn, always"),
    _a("--no-skip-chat-parsing", None, "tool calls are always parsed from the answer"),
    _a("--no-mmproj --no-mmproj-auto --no-mmproj-offload", None, "hydrad loads a projector only when --mmproj names "
       "one, and runs it where the model's layers run"),
    _a("-no-ag --no-agent --no-ui-mcp-proxy --no-webui-mcp-proxy", None, "hydrad has no agent tools or MCP proxy"),
    _a("--no-spec-draft-backend-sampling", None, NO_SPECULATIVE),
)

NEUTRAL: tuple[Flag, ...] = (
    _n("-fit --fit", "on|off", "off", "hydrad never shrinks unset parameters to fit the device (as --fit off); "
       "size the context with -c", optional="on"),
    _n("--log-colors", "on|off|auto", "off auto", "hydrad's log lines are never coloured", optional="on"),
    _n("--presence-penalty", "N", "0", PER_REQUEST),
    _n("--frequency-penalty", "N", "0", PER_REQUEST),
    _n("--embd-normalize", "N", "2", "embeddings are normalised as a request's embd_normalize says (default 2)"),
    _n("--mirostat", "N", "0", NO_SAMPLER),
    _n("--typical --typical-p", "N", "1", NO_SAMPLER),
    _n("--top-nsigma --top-n-sigma", "N", "-1", NO_SAMPLER),
    _n("--xtc-probability", "N", "0", NO_SAMPLER),
    _n("--dry-multiplier", "N", "0", NO_SAMPLER),
    _n("--dynatemp-range", "N", "0", NO_SAMPLER),
    _n("--adaptive-target", "N", "-1", NO_SAMPLER),
    _n("--reasoning-format", "FORMAT", "none", "hydrad leaves a model's thoughts in the content, as "
       "--reasoning-format none"),
    _n("--reasoning-budget", "N", "-1", "hydrad never limits a model's thinking"),
    _n("--reasoning-effort", "LEVEL", "default", "hydrad passes no reasoning effort to the template"),
    _n("--sse-ping-interval", "N", "-1", "hydrad sends no keep-alive pings in its streams (as -1)"),
    _n("-lzm --lazy-mode", "MODE", "auto", "hydrad reads tensors as llama.cpp does by default (auto)"),
    _n("--prio", "N", "0", "hydrad runs at the priority it is started with: set systemd's Nice= instead"),
    _n("--poll", "<0...100>", "50", "hydrad's threads poll as llama.cpp's do by default (50)"),
)

REFUSED: tuple[Flag, ...] = (
    _r("-cl --cache-list", None, "hydrad has no model cache: it loads the file -m names"),
    _r("--completion-bash", None, "hydrad prints no completion script"),
    _r("--list-devices", None, "hydrad lists no devices: nvidia-smi does"),
    _r("-C --cpu-mask", "M", AFFINITY), _r("-Cr --cpu-range", "lo-hi", AFFINITY),
    _r("--cpu-strict", "<0|1>", AFFINITY), _r("-Cb --cpu-mask-batch", "M", AFFINITY),
    _r("-Crb --cpu-range-batch", "lo-hi", AFFINITY), _r("--cpu-strict-batch", "<0|1>", AFFINITY),
    _r("--prio-batch", "N", AFFINITY), _r("--poll-batch", "<0|1>", AFFINITY),
    _r("--numa", "TYPE", "hydrad makes no NUMA placement: bind the unit to a node with systemd's NUMAPolicy="),
    _r("-nkvo --no-kv-offload", None, "hydrad keeps the KV cache on the device of its layers"),
    _r("-nr --no-repack", None, "hydrad always lets llama.cpp repack weights"),
    _r("--no-op-offload", None, "hydrad always offloads host tensor operations"),
    _r("--no-warmup", None, "hydrad always warms a model up before it serves"),
    _r("--rpc", "SERVERS", "hydrad's peers are other engines' merged RPC ports, set as defaults.rpc_servers "
       "in a YAML file or by the coordinator's COMBINE profiles"),
    _r("--mlock", None, "hydrad never locks the model in memory"),
    _r("-cmoe --cpu-moe", None, "keep experts on the CPU with -ot '\\.ffn_(up|down|gate)_exps=CPU'"),
    _r("-ncmoe --n-cpu-moe", "N", "keep experts on the CPU with -ot and a pattern naming the layers"),
    _r("-ncffn --n-cpu-ffn", "N", "keep FFN weights on the CPU with -ot and a pattern naming the layers"),
    _r("-fitt --fit-target", "MiB0,...", "hydrad never fits parameters to the device"),
    _r("-fitc --fit-ctx", "N", "hydrad never fits parameters to the device"),
    _r("--check-tensors", None, "hydrad does not check tensor data at load"),
    _r("--override-kv", "KEY=TYPE:VALUE,...", "hydrad does not override model metadata"),
    _r("-mu --model-url", "MODEL_URL", NO_DOWNLOAD),
    _r("-dr --docker-repo", "REPO", NO_DOWNLOAD),
    _r("-hf -hfr --hf-repo", "REPO", NO_DOWNLOAD),
    _r("-hff --hf-file", "FILE", NO_DOWNLOAD),
    _r("-hft --hf-token", "TOKEN", NO_DOWNLOAD),
    _r("--log-disable", None, "hydrad always logs (to stderr, the journal under systemd); -lv 1 keeps errors only"),
    _r("--log-file", "FNAME", "hydrad logs to stderr (the journal under systemd): redirect it"),
    _r("--log-jsonl", None, "hydrad's log lines are key=value"),
    _r("--no-log-prefix", None, "every log line names its level"),
    _r("--no-log-timestamps", None, "every log line is timed"),
    _r("--samplers", "SAMPLERS", "hydrad's sampler order is fixed (a request's samplers is refused too)"),
    _r("--sampler-seq --sampling-seq", "SEQUENCE", "hydrad's sampler order is fixed"),
    _r("--ignore-eos", None, PER_REQUEST),
    _r("-l --logit-bias", "TOKEN_ID(+/-)BIAS", "hydrad has no logit bias (a request's is refused too)"),
    _r("--grammar", "GRAMMAR", PER_REQUEST),
    _r("--grammar-file", "FNAME", PER_REQUEST),
    _r("-j --json-schema", "SCHEMA", PER_REQUEST),
    _r("-jf --json-schema-file", "FILE", PER_REQUEST),
    _r("-bs --backend-sampling", None, "hydrad samples on the CPU"),
    _r("--xtc-threshold", "N", INERT), _r("--dry-base", "N", INERT), _r("--dry-allowed-length", "N", INERT),
    _r("--dry-penalty-last-n", "N", INERT), _r("--dry-sequence-breaker", "STRING", INERT),
    _r("--adaptive-decay", "N", INERT), _r("--dynatemp-exp", "N", INERT), _r("--mirostat-lr", "N", INERT),
    _r("--mirostat-ent", "N", INERT),
    _r("-lcs --lookup-cache-static", "FNAME", NO_SPECULATIVE),
    _r("-lcd --lookup-cache-dynamic", "FNAME", NO_SPECULATIVE),
    _r("--kv-unified-per-slot", "N", "size the context with -c and the slots with -np"),
    _r("-ctxcp --ctx-checkpoints --swa-checkpoints", "N", NO_CHECKPOINTS),
    _r("-cms --checkpoint-min-step", "N", NO_CHECKPOINTS),
    _r("-r --reverse-prompt", "PROMPT", PER_REQUEST + " (stop)"),
    _r("-sp --special", None, "hydrad never writes special tokens into an answer's text"),
    _r("--spm-infill", None, "hydrad builds /infill prompts in prefix-suffix-middle order only"),
    _r("-nocb --no-cont-batching", None, "continuous batching is always on"),
    _r("-mmu --mmproj-url", "URL", NO_MULTIMODAL),
    _r("--mmproj-auto", None, NO_MULTIMODAL), _r("--mmproj-offload", None, NO_MULTIMODAL),
    _r("-mmdev --mmproj-device", "DEVICE", NO_MULTIMODAL), _r("--image-min-tokens", "N", NO_MULTIMODAL),
    _r("--image-max-tokens", "N", NO_MULTIMODAL), _r("--mtmd-batch-max-tokens", "N", NO_MULTIMODAL),
    _r("--video-fps", "N", NO_MULTIMODAL), _r("--video-timestamp-interval", "N", NO_MULTIMODAL),
    _r("--video-ffmpeg-dir", "DIR", NO_MULTIMODAL),
    _r("--tags", "STRING", "hydrad reports no model tags"),
    _r("--reuse-port", None, "hydrad binds its port alone"),
    _r("--path", "PATH", "hydrad serves its own chat page at / and no other static files"),
    _r("--cors-methods", "METHODS", "CORS allows GET, POST and OPTIONS, always"),
    _r("--cors-headers", "HEADERS", "CORS allows Authorization, Content-Type and X-Session-Id, always"),
    _r("--cors-credentials", None, "CORS never allows credentials here"),
    _r("--api-prefix", "PREFIX", "hydrad serves its endpoints at the root: put a prefix in a proxy in front"),
    _r("--ui-config --webui-config", "JSON", "hydrad's chat page takes no configuration"),
    _r("--ui-config-file --webui-config-file", "PATH", "hydrad's chat page takes no configuration"),
    _r("--ui-mcp-proxy --webui-mcp-proxy", None, "hydrad has no MCP proxy"),
    _r("--tools", "TOOL1,TOOL2,...", "hydrad runs no built-in tools"),
    _r("--tools-runtime", "OPTION", "hydrad runs no built-in tools"),
    _r("--mcp-servers-config", "PATH", "hydrad has no MCP client"),
    _r("--mcp-servers-json", "JSON", "hydrad has no MCP client"),
    _r("-ag --agent", None, "hydrad has no agent tools"),
    _r("--ssl-key-file", "FNAME", "hydrad speaks plain HTTP: put TLS in a proxy in front"),
    _r("--ssl-cert-file", "FNAME", "hydrad speaks plain HTTP: put TLS in a proxy in front"),
    _r("--chat-template-kwargs", "STRING", "hydrad passes no extra arguments to the chat template"),
    _r("--props", None, "POST /props is not served: change the defaults with POST /control/configure"),
    _r("--media-path", "PATH", NO_MULTIMODAL),
    _r("--models-dir", "PATH", NO_ROUTER), _r("--models-preset", "PATH", NO_ROUTER),
    _r("--models-max", "N", NO_ROUTER), _r("--models-autoload --no-models-autoload", None, NO_ROUTER),
    _r("--reasoning-budget-message", "MESSAGE", "hydrad never limits a model's thinking"),
    _r("--reasoning-preserve --no-reasoning-preserve", None, "hydrad keeps no reasoning apart from the content"),
    _r("--skip-chat-parsing", None, "tool calls are always parsed from the answer"),
    _r("--prefill-assistant", None, "a chat's last assistant message is a whole message and the answer a new turn "
       "(as --no-prefill-assistant)"),
    _r("--log-prompts-dir", "PATH", "hydrad writes no prompts to disk"),
    _r("--spec-draft-type-k -ctkd --cache-type-k-draft", "TYPE", NO_SPECULATIVE),
    _r("--spec-draft-type-v -ctvd --cache-type-v-draft", "TYPE", NO_SPECULATIVE),
    _r("--spec-draft-hf -hfd -hfrd --hf-repo-draft", "REPO", NO_SPECULATIVE),
    _r("--spec-draft-threads -td --threads-draft", "N", NO_SPECULATIVE),
    _r("--spec-draft-threads-batch -tbd --threads-batch-draft", "N", NO_SPECULATIVE),
    _r("--spec-draft-cpu-mask -Cd --cpu-mask-draft", "M", NO_SPECULATIVE),
    _r("--spec-draft-cpu-range -Crd --cpu-range-draft", "lo-hi", NO_SPECULATIVE),
    _r("--spec-draft-cpu-strict --cpu-strict-draft", "<0|1>", NO_SPECULATIVE),
    _r("--spec-draft-prio --prio-draft", "N", NO_SPECULATIVE),
    _r("--spec-draft-poll --poll-draft", "<0|1>", NO_SPECULATIVE),
    _r("--spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft", "M", NO_SPECULATIVE),
    _r("--spec-draft-cpu-strict-batch --cpu-strict-batch-draft", "<0|1>", NO_SPECULATIVE),
    _r("--spec-draft-prio-batch --prio-batch-draft", "N", NO_SPECULATIVE),
    _r("--spec-draft-poll-batch --poll-batch-draft", "<0|1>", NO_SPECULATIVE),
    _r("--spec-draft-override-tensor -otd --override-tensor-draft", "PATTERN=TYPE,...", NO_SPECULATIVE),
    _r("--spec-draft-cpu-moe -cmoed --cpu-moe-draft", None, NO_SPECULATIVE),
    _r("--spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft", "N", NO_SPECULATIVE),
    _r("--spec-synth-len", "L", NO_SPECULATIVE), _r("--spec-synth-rates", "P0,P1,...", NO_SPECULATIVE),
    _r("--spec-draft-p-split --draft-p-split", "P", NO_SPECULATIVE),
    _r("--spec-draft-backend-sampling", None, NO_SPECULATIVE),
    _r("--spec-draft-device -devd --device-draft", "<dev1,dev2,..>", NO_SPECULATIVE),
    _n("--spec-ngram-simple-min-hits", "N", "1", "hydrad's n-gram lookup drafts on the first hit (as 1)"),
    _r("--spec-ngram-map-k-size-n", "N", NO_SPECULATIVE), _r("--spec-ngram-map-k-size-m", "N", NO_SPECULATIVE),
    _r("--spec-ngram-map-k-min-hits", "N", NO_SPECULATIVE),
    _r("--spec-ngram-map-k4v-size-n", "N", NO_SPECULATIVE), _r("--spec-ngram-map-k4v-size-m", "N", NO_SPECULATIVE),
    _r("--spec-ngram-map-k4v-min-hits", "N", NO_SPECULATIVE),
    _r("--draft --draft-n --draft-max", "N", "removed from llama-server too; " + NO_SPECULATIVE),
    _r("--draft-min --draft-n-min", "N", "removed from llama-server too; " + NO_SPECULATIVE),
    _r("--spec-ngram-size-n", "N", "removed from llama-server too; " + NO_SPECULATIVE),
    _r("--spec-ngram-size-m", "N", "removed from llama-server too; " + NO_SPECULATIVE),
    _r("--spec-ngram-min-hits", "N", "removed from llama-server too; " + NO_SPECULATIVE),
    _r("--embd-gemma-default --fim-qwen-1.5b-default --fim-qwen-3b-default --fim-qwen-7b-default "
       "--fim-qwen-7b-spec --fim-qwen-14b-spec --fim-qwen-30b-default --gpt-oss-20b-default "
       "--gpt-oss-120b-default --vision-gemma-4b-default --vision-gemma-12b-default --spec-default", None,
       NO_DOWNLOAD),
)

FLAGS: tuple[Flag, ...] = MAPPED + ACCEPTED + NEUTRAL + REFUSED
BY_NAME: dict[str, Flag] = {name: f for f in FLAGS for name in f.names}
