"""Runtime parameters of an engine, each with the tier that says what a change costs.

Effective parameters are layered: built-in defaults < the model registry's defaults for the
chosen model < the YAML ``defaults:`` block < runtime payloads (``POST /control/configure``).
A payload is merged into the runtime layer, the result is diffed against the last applied
snapshot, and the highest tier among the changed fields decides the action. Keeping this
module pure (no llama.cpp, no I/O) lets the same rules serve the HTTP plane, the merged RPC
port and the coordinator's bus.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, StringConstraints, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from hydrad.common import paramcontract, templatekwargs
from hydrad.common.modeloverrides import check_tensor_override, parse_kv_override
from hydrad.common.netaccess import split_endpoint
from hydrad.common.specparams import SpecParams


class Tier(enum.IntEnum):
    """What applying a change costs, from free to a restart."""

    NONE = 0
    T1 = 1  # per request: nothing to rebuild
    T2 = 2  # rebuild the context, keep the model
    T3 = 3  # reload the model
    T4 = 4  # restart only; never accepted at runtime

    @property
    def action(self) -> str:
        return {0: "none", 1: "apply", 2: "rebuild_context", 3: "reload_model", 4: "restart"}[self.value]


def _f(default: Any, tier: Tier, description: str, **kw: Any) -> Any:
    return Field(default, description=description, json_schema_extra={"tier": int(tier)}, **kw)


CacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]

MAX_LORA_ADAPTERS = 16
"""LoRA adapters one model loads at most (each is a set of tensors beside the weights, applied per step)."""
MAX_CONTROL_VECTORS = 16
"""Control vectors one model sums at most (llama-server adds them up into one)."""
MAX_ADAPTER_SCALE = 1000.0


class AdapterFile(BaseModel):
    """A LoRA adapter or a control vector: a GGUF file, absolute or under models_dir, and its scale."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    path: str = Field(min_length=1, max_length=4096, description="GGUF file, absolute or under models_dir.")
    scale: float = Field(1.0, ge=-MAX_ADAPTER_SCALE, le=MAX_ADAPTER_SCALE, description="How strongly it applies.")


class RuntimeParams(SpecParams):
    """Everything an engine can change while it runs; the shape follows llama.cpp's common_params."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- T3: the model itself
    model: str | None = _f(None, Tier.T3, "Model to serve: a registry alias, or a GGUF path (absolute or under models_dir). None = no model.")
    n_gpu_layers: int = _f(-1, Tier.T3, "Layers to offload to the GPU; -1 = all. Ignored on a CPU-only build.", ge=-1)
    split_mode: Literal["none", "layer", "row"] = _f("layer", Tier.T3, "How to split the model across devices.")
    tensor_split: list[float] | None = _f(None, Tier.T3, "Fraction of the model per device, e.g. [0.6, 0.4].")
    main_gpu: int = _f(0, Tier.T3, "Device for the whole model (split_mode=none) or for intermediate results.", ge=0)
    rpc_servers: list[Annotated[str, StringConstraints(max_length=300)]] | None = _f(
        None, Tier.T3, "COMBINE: peers whose devices join this engine's, as host:port of each peer's merged RPC "
        "port (the coordinator resolves engine names). Device order: own GPUs, then each peer's devices; "
        "tensor_split gives one share per device, and on a host without a GPU the first share is this CPU's.",
        max_length=8)
    devices: list[Annotated[str, StringConstraints(min_length=1, max_length=128)]] | None = _f(
        None, Tier.T3, "Devices to offload to, by ggml name, in this order (llama-server's --device): e.g. ['CUDA0']; "
        "['none'] = none, every weight on the CPU; null = every GPU this engine may see (the start-only setting "
        "`device` decides which those are). A name this engine has no device of fails the load naming the known ones.",
        min_length=1, max_length=16)
    n_cpu_moe: int = _f(
        0, Tier.T3, "Keep the expert tensors of the first N layers in host memory, computed by the CPU "
        "(llama-server's --n-cpu-moe): one override per layer, blk\\.<i>\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU, "
        "after override_tensors' own entries. N at or above the model's layer count keeps every expert on the CPU "
        "(llama-server's --cpu-moe). Their bytes count as host memory, not VRAM, in the load's estimate and in routing.",
        ge=0, le=4096)
    override_tensors: list[Annotated[str, StringConstraints(max_length=1000)]] | None = _f(
        None, Tier.T3, "Tensor placement overrides in llama.cpp's -ot syntax, REGEX=BUFFER_TYPE (CPU, CUDA0, "
        "RPC0[host:port], or RPC / RPC<i> for a peer's device), e.g. '\\.ffn_(up|down|gate)_exps=RPC'. The first "
        "entry whose regex matches a tensor's name (anywhere in it) places that tensor. Also accepted under "
        "llama.cpp's own name, tensor_buft_overrides.",
        max_length=64)
    kv_overrides: list[Annotated[str, StringConstraints(max_length=300)]] | None = _f(
        None, Tier.T3, "Model metadata overrides in llama-server's --override-kv syntax, KEY=TYPE:VALUE with TYPE "
        "int, float, bool (true/false) or str (at most 127 bytes), e.g. 'tokenizer.ggml.add_bos_token=bool:false'. "
        "A key the GGUF holds with another type, or one llama.cpp does not read while loading this model, fails "
        "the load naming it (llama.cpp itself would ignore it with a warning).",
        max_length=64)
    use_mmap: bool = _f(True, Tier.T3, "Map the GGUF instead of reading it into memory.")
    use_mlock: bool = _f(
        False, Tier.T3, "Lock the weights in RAM so the kernel never swaps or compresses them (llama.cpp's load mode "
        "mmap+mlock, or mlock with use_mmap false: llama-server's --load-mode, formerly --mlock). Locking beyond RLIMIT_MEMLOCK fails with a "
        "warning in the log and the load goes on unlocked.")
    use_direct_io: bool = _f(
        False, Tier.T3, "Read the GGUF with direct I/O, past the page cache, where the file system allows it (llama.cpp's "
        "load mode dio; it falls back to a plain read where not). Takes precedence over use_mmap; with use_mlock it "
        "is refused (llama.cpp has no load mode that locks a direct read).")
    check_tensors: bool = _f(
        False, Tier.T3, "Validate every tensor's data while loading (llama-server's --check-tensors): a tensor with "
        "NaN or infinite values, or invalid quantization blocks, fails the load naming it. Costs a pass over the "
        "weights at each load.")
    no_host: bool = _f(
        False, Tier.T3, "Keep the weights that stay on the CPU (with every layer on a GPU: the token embeddings) in "
        "ordinary memory, not the GPU's page-locked host buffer (llama.cpp's --no-host). Matters only with use_mmap "
        "false (a mapping is used in place): page-locking them at the load's start stalls every context on the GPU, "
        "a serving generation's included. Costs prompt speed only where layers stay on the CPU.")
    embeddings: bool = _f(
        False, Tier.T3, "Serve /v1/embeddings and llama-server's /embedding: a second, small llama.cpp context on "
        "the same weights computes them between generation steps (its size: n_ubatch tokens, the longest input). "
        "Off: those endpoints answer 501 saying how to turn this on.")
    pooling: Literal["model", "none", "mean", "cls", "last", "rank"] = _f(
        "model", Tier.T3, "How an input's token vectors become its embedding (llama.cpp's --pooling): mean, cls "
        "(first token), last, none (one vector per token: /embedding only), rank (a reranker's classification head "
        "scores each input: /rerank only; the GGUF must declare rank pooling), model = as the GGUF says (none for a "
        "generative model, rank for a reranker).")
    mmproj: str | None = _f(
        None, Tier.T3, "Vision projector loaded with the model (llama-server's --mmproj): a GGUF path, absolute or "
        "under models_dir, of a projector made for this model. With one, chat image_url parts, Anthropic image "
        "blocks and /completion's multimodal_data are served (docs/engine.md, Images); it runs on the GPU when "
        "the model's layers do (n_gpu_layers not 0). None = text only: requests with images are refused.",
        max_length=4096)
    lora_adapters: list[AdapterFile] | None = _f(
        None, Tier.T3, "LoRA adapters loaded with the model (llama-server's --lora, --lora-scaled), each "
        "{path, scale}; id = the position in this list. A request picks scales by id (its lora field: "
        "[{id, scale}], the adapters it names not at 0), POST /lora-adapters sets the scales a request "
        "naming none runs with. Each must be a LoRA of this model's architecture whose tensors fit its "
        "weights, or the load fails naming this field.", max_length=MAX_LORA_ADAPTERS)
    lora_init_without_apply: bool = _f(
        False, Tier.T3, "Load the LoRA adapters at scale 0 (llama-server's --lora-init-without-apply): "
        "none applies until POST /lora-adapters or a request's lora sets a scale.")
    control_vectors: list[AdapterFile] | None = _f(
        None, Tier.T3, "Control vectors (llama-server's --control-vector, --control-vector-scaled), each "
        "{path, scale}: GGUFs of direction.<layer> tensors of n_embd floats, summed times their scales and "
        "added to each layer's output for every request.", max_length=MAX_CONTROL_VECTORS)
    control_vector_layer_range: list[Annotated[int, Field(ge=0, le=1 << 16)]] | None = _f(
        None, Tier.T3, "The layers [start, end] (both included) the control vectors apply to "
        "(llama-server's --control-vector-layer-range); 0 as start = from layer 1, as end = to the last; "
        "None = every layer.", min_length=2, max_length=2)

    # --- T2: the context
    n_ctx: int = _f(8192, Tier.T2, "Context size in tokens, shared by all slots (unified KV cache); 0 = the model's training context.", ge=0)
    n_batch: int = _f(2048, Tier.T2, "Logical batch: most tokens submitted to one decode step.", ge=1)
    n_ubatch: int = _f(512, Tier.T2, "Physical batch: most tokens computed at once.", ge=1)
    n_parallel: int = _f(4, Tier.T2, "Slots: requests decoded together by continuous batching.", ge=1, le=256)
    kv_unified: bool = _f(True, Tier.T2, "One KV buffer for all slots, so any slot can use the whole context.")
    cache_type_k: CacheType = _f("f16", Tier.T2, "Data type of the K cache.")
    cache_type_v: CacheType = _f("f16", Tier.T2, "Data type of the V cache (quantized V needs flash attention).")
    flash_attn: Literal["auto", "on", "off"] = _f("auto", Tier.T2, "Flash attention.")
    n_threads: int = _f(0, Tier.T2, "CPU threads for generation; 0 = every CPU the engine may use (its affinity mask, capped by a cgroup CPU quota such as systemd's CPUQuota=).", ge=0)
    n_threads_batch: int = _f(0, Tier.T2, "CPU threads for prompt processing; 0 = same as n_threads.", ge=0)
    rope_scaling: Literal["model", "none", "linear", "yarn", "longrope"] = _f("model", Tier.T2, "RoPE scaling type; 'model' = as the GGUF says.")
    rope_freq_base: float = _f(0.0, Tier.T2, "RoPE base frequency; 0 = from the model.", ge=0)
    rope_freq_scale: float = _f(0.0, Tier.T2, "RoPE frequency scale; 0 = from the model.", ge=0)
    yarn_ext_factor: float = _f(-1.0, Tier.T2, "YaRN extrapolation mix factor; negative = from the model.")
    yarn_attn_factor: float = _f(1.0, Tier.T2, "YaRN magnitude scaling factor.")
    yarn_beta_fast: float = _f(32.0, Tier.T2, "YaRN low correction dimension.")
    yarn_beta_slow: float = _f(1.0, Tier.T2, "YaRN high correction dimension.")
    yarn_orig_ctx: int = _f(0, Tier.T2, "YaRN original context size; 0 = from the model.", ge=0)

    # --- T1: per request defaults
    temperature: float = _f(0.8, Tier.T1, "Default sampling temperature; 0 = greedy.", ge=0)
    top_k: int = _f(40, Tier.T1, "Default top-k; 0 = off.", ge=0)
    top_p: float = _f(0.95, Tier.T1, "Default nucleus sampling threshold; 1 = off.", ge=0, le=1)
    min_p: float = _f(0.05, Tier.T1, "Default min-p threshold; 0 = off.", ge=0, le=1)
    repeat_penalty: float = _f(1.0, Tier.T1, "Default repetition penalty; 1 = off.", ge=0)
    repeat_last_n: int = _f(64, Tier.T1, "Tokens considered by the repetition penalty.", ge=0)
    seed: int = _f(-1, Tier.T1, "Default sampling seed; -1 = random per request.")
    n_predict: int = _f(-1, Tier.T1, "Default token limit when a request sets none; -1 = until the context is full.", ge=-1)
    chat_template: str | None = _f(None, Tier.T1, "Chat template name (e.g. chatml) or template text; None = the model's own.")
    cache_prompt: bool = _f(True, Tier.T1, "Reuse the KV of a slot that shares a prefix with a new prompt.")
    ctx_shift: bool = _f(
        False, Tier.T1, "Context shift (llama-server's --context-shift, off by default as there): a generation that "
        "fills its slot's context drops half of the tokens after the first n_keep and goes on, instead of ending "
        "with finish_reason length. Only a request whose own limit (max_tokens, or n_predict) reaches past the "
        "context shifts. Ignored (the request ends at the context's end) where the model's KV cache cannot shift "
        "(multi-position RoPE, recurrent memory): the load view says why.")
    n_keep: int = _f(
        0, Tier.T1, "Prompt tokens a context shift keeps at the head of the context (llama-server's --keep), not "
        "counting the BOS token; -1 = the whole prompt. A request's n_keep overrides it.", ge=-1)
    n_cache_reuse: int = _f(
        0, Tier.T1, "Reuse chunks of a slot's cached prompt that a new prompt repeats after where they part, by "
        "shifting their KV to the new positions (llama-server's --cache-reuse): the smallest chunk worth it, in "
        "tokens; 0 = off. The reused KV is approximate (it was computed after other tokens), as in llama-server; "
        "it is never handed to another conversation (prefix sharing, the Store). Needs cache_prompt. A request's "
        "n_cache_reuse overrides it.", ge=0)
    cache_ram_mib: int = _f(
        0, Tier.T1, "Host memory for the KV of conversations whose slot another prompt takes (llama-server's "
        "--cache-ram), MiB: a later prompt that begins with one gets it back instead of prefilling it; least "
        "recently used first out; 0 = off (llama-server's default is 8192), -1 = no limit. Needs cache_prompt.", ge=-1)
    reasoning_format: Literal["none", "deepseek", "deepseek-legacy"] = _f(
        "deepseek", Tier.T1, "What a chat answer does with the model's thinking, the text between <think> and "
        "</think> at the start of the answer (or from the start, when the template opened the think block itself), "
        "as llama-server's --reasoning-format: deepseek = in reasoning_content (OpenAI) or thinking blocks "
        "(Anthropic, when the request enables thinking), the rest in content; deepseek-legacy = reasoning_content "
        "too, and the content keeps the think tags; none = everything in content. A request's reasoning_format "
        "overrides it.")
    reasoning_budget: int = _f(
        -1, Tier.T1, "Tokens a chat answer may think for (llama-server's --reasoning-budget): -1 = no limit; 0 = no "
        "thinking (the template is rendered with enable_thinking false, and a think block the model opens anyway "
        "is closed at once); N = the think block is closed after N tokens by writing </think> for the model. "
        "Not enforced under a grammar, which decides the whole answer. A request's reasoning_budget_tokens "
        "(or thinking_budget_tokens) overrides it.", ge=-1)
    default_template_kwargs: dict[str, Any] | None = _f(
        None, Tier.T1, "Extra variables for a jinja chat template (llama-server's --chat-template-kwargs), e.g. "
        "{\"enable_thinking\": false}; a request's chat_template_kwargs are merged over them. Given, the chat is "
        "rendered by jinja; with a built-in template named by chat_template (or a model without a jinja template) "
        "they are not applied.")
    reload_policy: Literal["auto", "overlap", "drain"] = _f(
        "auto", Tier.T1, "How a model reload proceeds: overlap (new generation built while the old serves), drain "
        "(free the old first), auto (overlap when both fit in free memory).")
    reload_queue_timeout_s: float = _f(30.0, Tier.T1, "How long a request may wait for a loading model before a 503.", gt=0)
    text_overlap: Literal["auto", "on", "off"] = _f(
        "auto", Tier.T1, "Turn a step's tokens into text (detokenize, stop strings, stream out) while the device "
        "computes the next step; a stop string then costs one discarded token of compute. A step of prompt rows only "
        "(no token to sample) is not waited for: the next one is built while it computes. auto = on when layers run "
        "on a GPU, where llama_decode returns before the device is done; on a CPU it would only delay each token.")
    prefill_split: Literal["ubatch", "batch"] = _f(
        "ubatch", Tier.T1, "While several prompts wait, how much prompt a step takes. ubatch: at most n_ubatch tokens "
        "(decoding streams included), first-come prompts first, so the prompts in the first ubatch get their first "
        "token one ubatch later instead of after the whole batch (the device computes a batch one ubatch at a time "
        "anyway); batch: fill n_batch, as llama-server does. A lone prompt always takes up to n_batch.")
    sleep_idle_seconds: float = _f(
        -1, Tier.T1, "Free the model after this many seconds without a request (llama-server's --sleep-idle-seconds): "
        "the engine's stage becomes 'sleeping', its weights and context leave memory, and the first request "
        "afterwards loads the model again and is served once it is loaded (it waits as for any load, up to "
        "reload_queue_timeout_s). -1 or 0 = never sleep.", ge=-1, le=30 * 86400)

    @field_validator("rpc_servers")
    @classmethod
    def _endpoints(cls, v: list[str] | None) -> list[str] | None:
        for e in v or []:
            split_endpoint(e)
        return v or None

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data: Any) -> Any:
        """llama.cpp's own field names are accepted beside the project's (see :data:`ALIASES`), and a
        contract field the engine always behaves as (``cont_batching: true``) changes nothing."""
        return paramcontract.without_fixed(canonical_names(data)) if isinstance(data, dict) else data

    @field_validator("override_tensors")
    @classmethod
    def _overrides(cls, v: list[str] | None) -> list[str] | None:
        for item in v or []:
            check_tensor_override(item)
        return v or None

    @field_validator("devices")
    @classmethod
    def _devices(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if "none" in (d.lower() for d in v) and len(v) > 1:
            raise ValueError("'none' stands alone: it means no device at all")
        for d in v:
            if "," in d or not d.isprintable() or d != d.strip():
                raise ValueError(f"{d!r} is not a device name (one name per entry, e.g. CUDA0)")
        if len({d.upper() for d in v}) != len(v):
            raise ValueError("a device is named twice")
        return v

    @field_validator("kv_overrides")
    @classmethod
    def _kv(cls, v: list[str] | None) -> list[str] | None:
        seen: set[str] = set()
        for item in v or []:
            key = parse_kv_override(item).key
            if key in seen:
                raise ValueError(f"key {key!r} is overridden twice")
            seen.add(key)
        return v or None

    @field_validator("control_vector_layer_range")
    @classmethod
    def _layer_range(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and v[0] and v[1] and v[0] > v[1]:
            raise ValueError(f"start {v[0]} is past end {v[1]}")
        return v

    @field_validator("use_direct_io")
    @classmethod
    def _direct(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("use_mlock"):
            raise ValueError("use_direct_io and use_mlock together: llama.cpp has no load mode that locks a "
                             "direct read; drop one")
        return v

    @field_validator("default_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if v is None else templatekwargs.check(v)

    @field_validator("tensor_split")
    @classmethod
    def _split(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (len(v) > 128 or any(not (x >= 0 and x < float("inf")) for x in v) or not sum(v) > 0):
            raise ValueError("at most 128 finite, non-negative shares, not all zero")
        return v

    @classmethod
    def tier_of(cls, name: str) -> Tier:
        extra = cls.model_fields[name].json_schema_extra
        assert isinstance(extra, dict)
        return Tier(int(extra["tier"]))  # type: ignore[arg-type]

    def snapshot_hash(self, tier_at_least: Tier = Tier.T2) -> str:
        """Short hash of the fields at or above a tier: names the generation that serves requests."""
        data = {k: v for k, v in self.model_dump().items() if self.tier_of(k) >= tier_at_least}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


# llama.cpp's (common_params') name of a parameter → the name the project already used for it. Both are
# accepted everywhere a runtime parameter is (a configure, the YAML defaults, a registry entry, a
# profile's params) and the project's name is the one reported back. Read off the contract
# (hydrad.common.paramcontract): every carried field whose llama.cpp name is not the project's.
ALIASES: dict[str, str] = {
    key: e.param for e in paramcontract.ENTRIES if e.param is not None
    for key in (e.short, *e.also) if key != e.param and key not in RuntimeParams.model_fields
}


def canonical_names(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every alias renamed to its parameter; ValueError naming both spellings when a
    mapping holds the two, since which one was meant cannot be told."""
    both = [(a, n) for a, n in ALIASES.items() if a in values and n in values]
    if both:
        raise ValueError("; ".join(f"{a} and {n} are one parameter (llama.cpp's name and Hydra's): give one"
                                   for a, n in both))
    if not any(a in values for a in ALIASES):
        return values
    return {ALIASES.get(k, k): v for k, v in values.items()}


# Start-only settings: a runtime payload that names one is refused with the name.
T4_FIELDS: frozenset[str] = frozenset(
    {"name", "http", "host", "port", "rpc", "rpc_port", "models_dir", "registry", "control_allow_from",
     "logging", "log_level", "bus", "device", "drain_timeout_s"}
)


def param_named(message: str) -> str | None:
    """The runtime parameter a refusal's message names first (``"kv_overrides: ..."``), as the
    parameter's own name; None when it starts with none. A load that fails because of a parameter
    (a device llama.cpp does not have, a metadata key it never read) says so in those words, and the
    answer's ``param`` then names the field as a validation error's does."""
    head = message.partition(":")[0].strip().partition("[")[0]  # "lora_adapters[1]: ...": an entry of the list
    name = ALIASES.get(head, head)
    return name if name in RuntimeParams.model_fields else None


class ParamError(ValueError):
    """A payload that cannot be applied; ``fields`` names the offending fields."""

    def __init__(self, message: str, fields: list[str], code: str = "invalid_param") -> None:
        super().__init__(message)
        self.fields = fields
        self.code = code


def validation_message(exc: ValidationError, where: str = "") -> tuple[str, list[str]]:
    """Turn pydantic's error list into one readable line that names each field."""
    names: list[str] = []
    parts: list[str] = []
    for err in exc.errors():
        msg = err["msg"]
        loc = ".".join(str(p) for p in err["loc"])
        if not loc:  # a rule between fields (specparams) names the field it refuses first
            msg = msg.removeprefix("Value error, ")
            head = msg.split(" ", 1)[0]
            loc, msg = (head, msg.partition(" ")[2]) if head in RuntimeParams.model_fields else ("(root)", msg)
        names.append(loc)
        if err["type"] == "extra_forbidden":
            why = paramcontract.refusal(str(err["loc"][-1]), err.get("input"))
            msg = why.partition(": ")[2] if why else "unknown field"
        parts.append(f"{loc}: {msg}")
    prefix = f"{where}: " if where else ""
    return prefix + "; ".join(parts), names


def check_partial(values: dict[str, Any]) -> dict[str, Any]:
    """Validate a partial set of runtime parameters (a YAML ``defaults:`` block, a registry entry's
    defaults) as a pydantic field validator would: ValueError with every bad field named. Returns
    them under the parameters' own names (an alias such as ``tensor_buft_overrides`` renamed), the
    names every layer holds."""
    try:
        values = paramcontract.drop_fixed(canonical_names(values))
        RuntimeParams(**values)
    except ValidationError as exc:
        if any(e["loc"] for e in exc.errors()):  # a rule between fields (no loc) waits for the layers merged
            raise ValueError(validation_message(exc)[0]) from None
    return values


@dataclass(frozen=True)
class ConfigurePlan:
    """What a payload would do: the new layers, the fields whose effective value changes, the tier."""

    runtime: dict[str, Any]
    effective: RuntimeParams
    changed: list[str]
    tier: Tier


@dataclass
class ParamLayers:
    """The layered parameter sources and the last applied snapshot."""

    yaml: dict[str, Any] = field(default_factory=dict)
    runtime: dict[str, Any] = field(default_factory=dict)
    model_defaults: Any = None  # callable(model) -> dict, from the registry
    _sources_memo: tuple[str, dict[str, dict[str, Any]]] | None = field(default=None, repr=False, compare=False)

    def _model_layer(self, model: str | None) -> dict[str, Any]:
        if model is None or self.model_defaults is None:
            return {}
        return dict(self.model_defaults(model) or {})

    def effective_for(self, runtime: dict[str, Any]) -> RuntimeParams:
        yaml, runtime = canonical_names(self.yaml), canonical_names(runtime)
        chosen = {**yaml, **runtime}.get("model")
        merged = {**canonical_names(self._model_layer(chosen)), **yaml, **runtime}
        return RuntimeParams(**merged)

    def effective(self) -> RuntimeParams:
        return self.effective_for(self.runtime)

    def sources(self) -> dict[str, dict[str, Any]]:
        """Each field's effective value and the layer it came from. Remembered for the layers' current
        contents: every INFO and ``/health?verbose`` asks, and validating the merged layers costs a
        millisecond on the engine thread, between decode steps."""
        try:
            key = json.dumps([self.yaml, self.runtime], sort_keys=True, default=repr)
        except (TypeError, ValueError):  # keys that do not sort: compute without remembering
            return self._sources()
        if self._sources_memo is None or self._sources_memo[0] != key:
            self._sources_memo = (key, self._sources())
        return {name: dict(row) for name, row in self._sources_memo[1].items()}

    def _sources(self) -> dict[str, dict[str, Any]]:
        eff = self.effective()
        model_layer = self._model_layer(eff.model)
        out: dict[str, dict[str, Any]] = {}
        for name in RuntimeParams.model_fields:
            if name in self.runtime:
                src = "runtime"
            elif name in self.yaml:
                src = "yaml"
            elif name in model_layer:
                src = "model"
            else:
                src = "default"
            out[name] = {"value": getattr(eff, name), "source": src, "tier": f"T{int(RuntimeParams.tier_of(name))}"}
        return out

    def plan(self, payload: dict[str, Any]) -> ConfigurePlan:
        """Diff a payload against the applied snapshot. A ``null`` value drops a runtime override."""
        if not isinstance(payload, dict):
            raise ParamError("configure payload must be a JSON object", [])
        try:
            payload = canonical_names(payload)
        except ValueError as exc:
            raise ParamError(str(exc), sorted(k for k in payload if k in ALIASES)) from None
        restart_only = sorted(k for k in payload if k in T4_FIELDS)
        if restart_only:
            raise ParamError(
                f"start-only settings cannot change at runtime (restart the engine): {', '.join(restart_only)}",
                restart_only, code="restart_required")
        try:
            payload = paramcontract.drop_fixed(payload)
        except paramcontract.RefusedParam as exc:
            raise ParamError(str(exc), [exc.field], code="unsupported_param") from None
        unknown = sorted(k for k in payload if k not in RuntimeParams.model_fields)
        if unknown:
            raise ParamError(f"unknown parameter(s): {', '.join(unknown)}", unknown, code="unknown_param")
        runtime = dict(self.runtime)
        for k, v in payload.items():
            if v is None and k != "model":
                runtime.pop(k, None)
            else:
                runtime[k] = v
        try:
            new = self.effective_for(runtime)
        except ValidationError as exc:
            msg, names = validation_message(exc)
            raise ParamError(msg, names) from None
        old = self.effective()
        changed = [k for k in RuntimeParams.model_fields if getattr(old, k) != getattr(new, k)]
        tier = max((RuntimeParams.tier_of(k) for k in changed), default=Tier.NONE)
        return ConfigurePlan(runtime=runtime, effective=new, changed=changed, tier=tier)

    def commit(self, plan: ConfigurePlan) -> None:
        self.runtime = plan.runtime
