"""llama-server's command line as hydrad reads it (hydrad/cli/llamaflags.py): every flag llama-server
documents is mapped onto the setting a YAML file sets, accepted as a no-op, accepted at its neutral
values only, or refused by name with the reason; none is silently dropped. And ``--config`` lies over
the flags, field by field.

The list is every spelling in the option tables of ``tools/server/README.md`` of the llama.cpp that
llama-cpp-python 0.3.36 vendors (the build hydrad runs on), in its order, and the older spellings
scripts written for earlier llama-servers still use."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from hydrad.cli import hydrad as hydrad_cli
from hydrad.cli import llamaflags
from hydrad.cli.llamaflags import BY_NAME, FLAGS, FlagError
from hydrad.common.apikey import api_keys
from hydrad.common.registry import Registry
from hydrad.engine.settings import EngineSettings, load_config

REPO = Path(__file__).resolve().parents[3]
SMOLLM = "SmolLM2-135M-Instruct.Q4_1.gguf"

DOCUMENTED = (
    "-h --help --usage --version -cl --cache-list --completion-bash -t --threads -tb --threads-batch -C "
    "--cpu-mask -Cr --cpu-range --cpu-strict --prio --poll -Cb --cpu-mask-batch -Crb --cpu-range-batch "
    "--cpu-strict-batch --prio-batch --poll-batch -c --ctx-size -n --predict --n-predict -b --batch-size -ub "
    "--ubatch-size --keep --swa-full -fa --flash-attn --perf --no-perf -e --escape --no-escape --rope-scaling "
    "--rope-scale --rope-freq-base --rope-freq-scale --yarn-orig-ctx --yarn-ext-factor --yarn-attn-factor "
    "--yarn-beta-slow --yarn-beta-fast -kvo --kv-offload -nkvo --no-kv-offload --repack -nr --no-repack "
    "--no-host -ctk --cache-type-k -ctv --cache-type-v -dt --defrag-thold --rpc -lm --load-mode -lzm "
    "--lazy-mode --numa -dev --device --list-devices -ot --override-tensor -cmoe --cpu-moe -ncmoe --n-cpu-moe "
    "-ncffn --n-cpu-ffn -ngl --gpu-layers --n-gpu-layers -sm --split-mode -ts --tensor-split -mg --main-gpu "
    "-fit --fit -fitt --fit-target -fitc --fit-ctx --check-tensors --override-kv --op-offload --no-op-offload "
    "--lora --lora-scaled --control-vector --control-vector-scaled --control-vector-layer-range -m --model "
    "-mu --model-url -dr --docker-repo -hf -hfr --hf-repo -hff --hf-file -hft --hf-token --log-disable "
    "--log-file --log-jsonl --no-log-jsonl --log-colors -v --verbose --log-verbose --offline -lv --verbosity "
    "--log-verbosity --log-prefix --no-log-prefix --log-timestamps --no-log-timestamps --spec-draft-type-k "
    "-ctkd --cache-type-k-draft --spec-draft-type-v -ctvd --cache-type-v-draft --samplers -s --seed "
    "--sampler-seq --sampling-seq --ignore-eos --temp --temperature --top-k --top-p --min-p --top-nsigma "
    "--top-n-sigma --xtc-probability --xtc-threshold --typical --typical-p --repeat-last-n --repeat-penalty "
    "--presence-penalty --frequency-penalty --dry-multiplier --dry-base --dry-allowed-length "
    "--dry-penalty-last-n --dry-sequence-breaker --adaptive-target --adaptive-decay --dynatemp-range "
    "--dynatemp-exp --mirostat --mirostat-lr --mirostat-ent -l --logit-bias --grammar --grammar-file -j "
    "--json-schema -jf --json-schema-file -bs --backend-sampling -lcs --lookup-cache-static -lcd "
    "--lookup-cache-dynamic --kv-unified-per-slot -ctxcp --ctx-checkpoints --swa-checkpoints -cms "
    "--checkpoint-min-step -cram --cache-ram -kvu --kv-unified -no-kvu --no-kv-unified --cache-idle-slots "
    "--no-cache-idle-slots --context-shift --no-context-shift -r --reverse-prompt -sp --special --warmup "
    "--no-warmup --spm-infill --pooling -np --parallel -cb --cont-batching -nocb --no-cont-batching -mm "
    "--mmproj -mmu --mmproj-url --mmproj-auto --no-mmproj --no-mmproj-auto --mmproj-offload "
    "--no-mmproj-offload -mmdev --mmproj-device --image-min-tokens --image-max-tokens --mtmd-batch-max-tokens "
    "--video-fps --video-timestamp-interval --video-ffmpeg-dir -a --alias --tags --embd-normalize --host "
    "--port --reuse-port --path --cors-origins --cors-methods --cors-headers --cors-credentials "
    "--no-cors-credentials --api-prefix --ui-config --webui-config --ui-config-file --webui-config-file "
    "--ui-mcp-proxy --webui-mcp-proxy --no-ui-mcp-proxy --no-webui-mcp-proxy --tools --tools-runtime "
    "--mcp-servers-config --mcp-servers-json -ag --agent -no-ag --no-agent --ui --webui --no-ui --no-webui "
    "--embedding --embeddings --rerank --reranking --api-key --api-key-file --ssl-key-file --ssl-cert-file "
    "--chat-template-kwargs -to --timeout --sse-ping-interval --threads-http --cache-prompt --no-cache-prompt "
    "--cache-reuse --metrics --props --slots --no-slots --slot-save-path --media-path --models-dir "
    "--models-preset --models-max --models-autoload --no-models-autoload --jinja --no-jinja "
    "--reasoning-format -rea --reasoning --reasoning-effort --reasoning-budget --reasoning-budget-message "
    "--reasoning-preserve --no-reasoning-preserve --chat-template --chat-template-file --skip-chat-parsing "
    "--no-skip-chat-parsing --prefill-assistant --no-prefill-assistant -sps --slot-prompt-similarity "
    "--lora-init-without-apply --sleep-idle-seconds --log-prompts-dir --spec-draft-hf -hfd -hfrd "
    "--hf-repo-draft --spec-draft-threads -td --threads-draft --spec-draft-threads-batch -tbd "
    "--threads-batch-draft --spec-draft-cpu-mask -Cd --cpu-mask-draft --spec-draft-cpu-range -Crd "
    "--cpu-range-draft --spec-draft-cpu-strict --cpu-strict-draft --spec-draft-prio --prio-draft "
    "--spec-draft-poll --poll-draft --spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft "
    "--spec-draft-cpu-strict-batch --cpu-strict-batch-draft --spec-draft-prio-batch --prio-batch-draft "
    "--spec-draft-poll-batch --poll-batch-draft --spec-draft-override-tensor -otd --override-tensor-draft "
    "--spec-draft-cpu-moe -cmoed --cpu-moe-draft --spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed "
    "--n-cpu-moe-draft --spec-draft-n-max --spec-draft-n-min --spec-synth-len --spec-synth-rates "
    "--spec-draft-p-split --draft-p-split --spec-draft-p-min --draft-p-min --spec-draft-backend-sampling "
    "--no-spec-draft-backend-sampling --spec-draft-device -devd --device-draft --spec-draft-ngl -ngld "
    "--gpu-layers-draft --n-gpu-layers-draft --spec-draft-model -md --model-draft --spec-type "
    "--spec-ngram-mod-n-min --spec-ngram-mod-n-max --spec-ngram-mod-n-match --spec-ngram-simple-size-n "
    "--spec-ngram-simple-size-m --spec-ngram-simple-min-hits --spec-ngram-map-k-size-n "
    "--spec-ngram-map-k-size-m --spec-ngram-map-k-min-hits --spec-ngram-map-k4v-size-n "
    "--spec-ngram-map-k4v-size-m --spec-ngram-map-k4v-min-hits --draft --draft-n --draft-max --draft-min "
    "--draft-n-min --spec-ngram-size-n --spec-ngram-size-m --spec-ngram-min-hits --embd-gemma-default "
    "--fim-qwen-1.5b-default --fim-qwen-3b-default --fim-qwen-7b-default --fim-qwen-7b-spec "
    "--fim-qwen-14b-spec --fim-qwen-30b-default --gpt-oss-20b-default --gpt-oss-120b-default "
    "--vision-gemma-4b-default --vision-gemma-12b-default --spec-default "
).split()
OLDER = "--no-mmap --mmap --mlock".split()  # llama-server spellings from before --load-mode
HYDRAD_OWN = {"-h", "--help", "--usage", "--version"}
KEY = "k" * 20  # an API key hydrad takes (16 to 256 printable characters)


def parser() -> argparse.ArgumentParser:
    return hydrad_cli.build_parser()


def layer(*argv: str) -> llamaflags.CommandLine:
    return llamaflags.read(parser().parse_args(list(argv)).llama_flags)


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one line hydrad prints for ``argv`` on its way out with exit status 2."""
    with pytest.raises(SystemExit) as exit_:
        layer(*argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hydrad: "), err
    return err


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    p = tmp_path / "tiny.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00")  # the flags only check that the file is there
    return p


def test_every_documented_flag_is_classified() -> None:
    missing = [n for n in DOCUMENTED + OLDER if n not in BY_NAME and n not in HYDRAD_OWN]
    assert missing == []
    spellings = [n for f in FLAGS for n in f.names]
    assert len(spellings) == len(set(spellings))  # one meaning per spelling
    assert set(spellings) <= set(DOCUMENTED) | set(OLDER)  # nothing invented
    assert {f.kind for f in FLAGS} == {"mapped", "accepted", "neutral", "refused"}
    assert all(f.help for f in FLAGS)  # each says what it sets, or why it is accepted or refused


# (argv, {settings path: value}): each mapped flag and the setting it sets
MAPPED: list[tuple[list[str], dict[tuple[str, ...], Any]]] = [
    (["--host", "0.0.0.0"], {("http", "host"): "0.0.0.0"}),
    (["--port", "8081"], {("http", "port"): 8081}),
    (["--sleep-idle-seconds", "300"], {("defaults", "sleep_idle_seconds"): 300}),
    (["--reasoning", "off"], {("defaults", "default_template_kwargs"): {"enable_thinking": False}}),
    (["-rea", "on"], {("defaults", "default_template_kwargs"): {"enable_thinking": True}}),
    (["--metrics"], {("http", "metrics_endpoint"): True}),
    (["-to", "600"], {("http", "header_timeout_s"): 600.0}),
    (["--timeout", "30"], {("http", "header_timeout_s"): 30.0}),
    (["--cors-origins", "https://a.example,http://b.example:8000"],
     {("http", "cors_origins"): ["https://a.example", "http://b.example:8000"]}),
    (["--cors-origins", "*"], {("http", "cors_origins"): ["*"]}),
    (["--cors-origins", "localhost"], {("http", "cors_origins"): ["localhost"]}),
    (["-dev", "CUDA1"], {("device",): "1"}),
    (["--device", "CUDA0,CUDA1"], {("device",): "0,1"}),
    (["--no-slots"], {("http", "slots_endpoint"): False}),
    (["--no-slots", "--slots"], {("http", "slots_endpoint"): True}),
    (["-v"], {("logging", "level"): "debug"}),
    (["--verbose"], {("logging", "level"): "debug"}),
    (["--log-verbose"], {("logging", "level"): "debug"}),
    (["-lv", "1"], {("logging", "level"): "error"}),
    (["--verbosity", "2"], {("logging", "level"): "warning"}),
    (["--log-verbosity", "3"], {("logging", "level"): "info"}),
    (["-lv", "5"], {("logging", "level"): "debug"}),
    (["-c", "2048"], {("defaults", "n_ctx"): 2048}),
    (["--ctx-size", "0"], {("defaults", "n_ctx"): 0}),
    (["-n", "64"], {("defaults", "n_predict"): 64}),
    (["--predict", "-2"], {("defaults", "n_predict"): -1}),
    (["--n-predict", "-1"], {("defaults", "n_predict"): -1}),
    (["-b", "1024"], {("defaults", "n_batch"): 1024}),
    (["--batch-size", "512"], {("defaults", "n_batch"): 512}),
    (["-ub", "256"], {("defaults", "n_ubatch"): 256}),
    (["--ubatch-size", "128"], {("defaults", "n_ubatch"): 128}),
    (["-np", "2"], {("defaults", "n_parallel"): 2, ("defaults", "kv_unified"): False}),  # per-slot KV
    (["--parallel", "8"], {("defaults", "n_parallel"): 8, ("defaults", "kv_unified"): False}),
    (["-np", "2", "-kvu"], {("defaults", "n_parallel"): 2, ("defaults", "kv_unified"): True}),
    (["--kv-unified", "-np", "2"], {("defaults", "n_parallel"): 2, ("defaults", "kv_unified"): True}),
    (["-np", "-1"], {}),  # llama-server's auto: hydrad's default (4 slots)
    (["-t", "3"], {("defaults", "n_threads"): 3}),
    (["--threads", "-1"], {("defaults", "n_threads"): 0}),
    (["-tb", "2"], {("defaults", "n_threads_batch"): 2}),
    (["--threads-batch", "-1"], {("defaults", "n_threads_batch"): 0}),
    (["-ngl", "12"], {("defaults", "n_gpu_layers"): 12}),
    (["--gpu-layers", "all"], {("defaults", "n_gpu_layers"): -1}),
    (["--n-gpu-layers", "auto"], {("defaults", "n_gpu_layers"): -1}),
    (["-sm", "row"], {("defaults", "split_mode"): "row"}),
    (["--split-mode", "none"], {("defaults", "split_mode"): "none"}),
    (["-ts", "3,1"], {("defaults", "tensor_split"): [3.0, 1.0]}),
    (["--tensor-split", "0.6/0.4"], {("defaults", "tensor_split"): [0.6, 0.4]}),
    (["-mg", "1"], {("defaults", "main_gpu"): 1}),
    (["--main-gpu", "0"], {("defaults", "main_gpu"): 0}),
    (["-ot", "\\.ffn_up_exps=CPU", "--override-tensor", "a=CPU,b=CUDA0"],
     {("defaults", "override_tensors"): ["\\.ffn_up_exps=CPU", "a=CPU", "b=CUDA0"]}),
    (["-fa"], {("defaults", "flash_attn"): "on"}),
    (["-fa", "off"], {("defaults", "flash_attn"): "off"}),
    (["--flash-attn", "auto"], {("defaults", "flash_attn"): "auto"}),
    (["--flash-attn", "enabled"], {("defaults", "flash_attn"): "on"}),
    (["-ctk", "q8_0"], {("defaults", "cache_type_k"): "q8_0"}),
    (["--cache-type-k", "bf16"], {("defaults", "cache_type_k"): "bf16"}),
    (["-ctv", "q4_0"], {("defaults", "cache_type_v"): "q4_0"}),
    (["--cache-type-v", "f32"], {("defaults", "cache_type_v"): "f32"}),
    (["-kvu"], {("defaults", "kv_unified"): True}),
    (["--kv-unified"], {("defaults", "kv_unified"): True}),
    (["-no-kvu"], {("defaults", "kv_unified"): False}),
    (["--no-kv-unified"], {("defaults", "kv_unified"): False}),
    (["--mmap"], {("defaults", "use_mmap"): True}),
    (["--no-mmap"], {("defaults", "use_mmap"): False}),
    (["-lm", "none"], {("defaults", "use_mmap"): False}),
    (["--load-mode", "mmap"], {("defaults", "use_mmap"): True}),
    (["--load-mode", "auto"], {("defaults", "use_mmap"): True}),
    (["--no-host"], {("defaults", "no_host"): True}),
    (["--embedding"], {("defaults", "embeddings"): True}),
    (["--embeddings"], {("defaults", "embeddings"): True}),
    (["--pooling", "mean"], {("defaults", "pooling"): "mean"}),
    (["--pooling", "rank"], {("defaults", "pooling"): "rank"}),
    (["--reranking"], {("defaults", "embeddings"): True, ("defaults", "pooling"): "rank"}),
    (["--no-webui"], {("http", "webui"): False}), (["--no-ui"], {("http", "webui"): False}),
    (["--webui"], {("http", "webui"): True}), (["--ui"], {("http", "webui"): True}),
    (["--rerank"], {("defaults", "embeddings"): True, ("defaults", "pooling"): "rank"}),
    (["--rope-scaling", "yarn"], {("defaults", "rope_scaling"): "yarn"}),
    (["--rope-scale", "4"], {("defaults", "rope_freq_scale"): 0.25}),
    (["--rope-freq-base", "10000"], {("defaults", "rope_freq_base"): 10000.0}),
    (["--rope-freq-scale", "0.5"], {("defaults", "rope_freq_scale"): 0.5}),
    (["--yarn-orig-ctx", "4096"], {("defaults", "yarn_orig_ctx"): 4096}),
    (["--yarn-ext-factor", "0.5"], {("defaults", "yarn_ext_factor"): 0.5}),
    (["--yarn-attn-factor", "1.5"], {("defaults", "yarn_attn_factor"): 1.5}),
    (["--yarn-beta-slow", "2"], {("defaults", "yarn_beta_slow"): 2.0}),
    (["--yarn-beta-fast", "16"], {("defaults", "yarn_beta_fast"): 16.0}),
    (["--temp", "0"], {("defaults", "temperature"): 0.0}),
    (["--temperature", "0.7"], {("defaults", "temperature"): 0.7}),
    (["--top-k", "20"], {("defaults", "top_k"): 20}),
    (["--top-p", "0.9"], {("defaults", "top_p"): 0.9}),
    (["--min-p", "0.1"], {("defaults", "min_p"): 0.1}),
    (["--repeat-penalty", "1.1"], {("defaults", "repeat_penalty"): 1.1}),
    (["--repeat-last-n", "128"], {("defaults", "repeat_last_n"): 128}),
    (["-s", "42"], {("defaults", "seed"): 42}),
    (["--seed", "-1"], {("defaults", "seed"): -1}),
    (["--chat-template", "chatml"], {("defaults", "chat_template"): "chatml"}),
    (["--cache-prompt"], {("defaults", "cache_prompt"): True}),
    (["--no-cache-prompt"], {("defaults", "cache_prompt"): False}),
    (["--context-shift"], {("defaults", "ctx_shift"): True}),
    (["--no-context-shift"], {("defaults", "ctx_shift"): False}),
    (["--keep", "-1"], {("defaults", "n_keep"): -1}),
    (["--cache-reuse", "256"], {("defaults", "n_cache_reuse"): 256}),
    (["--cache-ram", "2048"], {("defaults", "cache_ram_mib"): 2048}),
    (["-cram", "-1"], {("defaults", "cache_ram_mib"): -1}),
    (["-c", "1024", "--ctx-size", "4096"], {("defaults", "n_ctx"): 4096}),  # the last one wins, as in llama-server
    (["--spec-type", "ngram-simple"], {("defaults", "spec_type"): "ngram"}),
    (["--spec-type", "none"], {("defaults", "spec_type"): "none"}),
    (["--spec-ngram-simple-size-n", "4"], {("defaults", "spec_ngram_size"): 4}),
    (["--spec-ngram-simple-size-m", "48"], {("defaults", "spec_n_max"): 48}),
    (["--spec-draft-n-max", "8"], {("defaults", "spec_n_max"): 8}),
    (["--spec-draft-n-min", "2"], {("defaults", "spec_n_min"): 2}),
    (["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "24", "--spec-ngram-mod-n-max", "64",
      "--spec-ngram-mod-n-min", "48"], {("defaults", "spec_type"): "ngram-mod", ("defaults", "spec_ngram_size"): 24,
                                        ("defaults", "spec_n_max"): 64, ("defaults", "spec_n_min"): 48}),
    (["--spec-type", "draft-simple", "-md", "/m/draft.gguf", "-ngld", "0", "--draft-p-min", "0.5"],
     {("defaults", "spec_type"): "draft", ("defaults", "spec_draft_model"): "/m/draft.gguf",
      ("defaults", "spec_draft_n_gpu_layers"): 0, ("defaults", "spec_p_min"): 0.5}),
    (["--spec-draft-model", "/m/d.gguf", "--model-draft", "/m/draft.gguf", "--spec-draft-ngl", "2",
      "--gpu-layers-draft", "3", "--n-gpu-layers-draft", "all", "--spec-draft-p-min", "0.25"],
     {("defaults", "spec_draft_model"): "/m/draft.gguf", ("defaults", "spec_draft_n_gpu_layers"): -1,
      ("defaults", "spec_p_min"): 0.25}),
]


@pytest.mark.parametrize("value", ["ngram-map-k", "draft-eagle3", "ngram-simple,ngram-mod", ""])
def test_spec_type_other_than_one_served_kind_is_refused(value: str) -> None:
    with pytest.raises(FlagError, match=r"^--spec-type: hydrad speculates by one kind at a time"):
        layer("--spec-type", value)


@pytest.mark.parametrize("argv, expected", MAPPED, ids=[" ".join(a) for a, _ in MAPPED])
def test_each_mapped_flag_sets_its_setting(argv: list[str], expected: dict[tuple[str, ...], Any]) -> None:
    cl = layer(*argv)
    assert {p: cl.get(p) for p in cl.origin} == expected
    assert all(cl.origin[p] in argv for p in expected)  # the flag as typed, for its errors
    settings = load_config(None, cl.layer).settings  # what the engine starts with
    for path, value in expected.items():
        node: Any = settings
        for part in path:
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        assert node == value, path


def test_every_mapped_spelling_is_exercised() -> None:
    used = {a for argv, _ in MAPPED for a in argv if a in BY_NAME}
    own_tests = {"-m", "--model", "-a", "--alias", "--api-key", "--api-key-file", "--slot-save-path",
                 "--chat-template-file", "--lora", "--lora-scaled", "--lora-init-without-apply", "--control-vector",
                 "--control-vector-scaled", "--control-vector-layer-range", "-mm", "--mmproj"}  # each has a test of its own below
    mapped = {n for f in FLAGS if f.kind == "mapped" for n in f.names}
    assert mapped - used - own_tests == set()


def test_model_and_aliases_make_a_registry_entry(gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cl = layer("-m", "tiny.gguf", "--alias", "my-model, other ,my-model,third")
    assert cl.layer["models"] == {"my-model": {"path": str(gguf), "aliases": ["other", "third"]}}
    assert cl.layer["defaults"]["model"] == "my-model"
    settings = load_config(None, cl.layer).settings
    registry = Registry.load(settings.registry, settings.models_dir, settings.models)
    for name in ("my-model", "other", "third"):
        resolved = registry.resolve(name)
        assert resolved.id == "my-model" and resolved.path == gguf, name
    # every name a request's model may use for it, llama-server's and the file's
    assert registry.resolve("third").names() >= {"my-model", "other", "third", "tiny.gguf", "tiny"}
    # without --alias the model is named by its file's name, as llama-server names it
    plain = layer("--model", str(gguf))
    assert plain.layer["models"] == {"tiny.gguf": {"path": str(gguf)}} and plain.layer["defaults"]["model"] == "tiny.gguf"
    assert plain.origin[("defaults", "model")] == "--model"


def test_a_llama_server_command_line_serves_metrics_only_with_the_flag(gguf: Path) -> None:
    """llama-server answers /metrics 501 unless --metrics is given: the same command line does here;
    a config file alone (no -m) keeps hydrad's default (served)."""
    assert layer("-m", str(gguf)).get(("http", "metrics_endpoint")) is False
    assert layer("-m", str(gguf), "--metrics").get(("http", "metrics_endpoint")) is True
    assert layer("--metrics", "-m", str(gguf)).get(("http", "metrics_endpoint")) is True
    assert layer("--port", "8080").get(("http", "metrics_endpoint")) is None


def test_model_and_alias_errors_name_the_flag(gguf: Path) -> None:
    with pytest.raises(FlagError, match=r"^-m: no such file: nowhere\.gguf$"):
        layer("-m", "nowhere.gguf")
    with pytest.raises(FlagError, match=r"^--alias: names the model -m/--model loads"):
        layer("--alias", "x")
    with pytest.raises(FlagError, match=r"^-a: needs at least one name"):
        layer("-m", str(gguf), "-a", " , ")


def test_templates_and_slot_files_from_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jinja").write_text("{{ messages }}", encoding="utf-8")
    cl = layer("--chat-template-file", "t.jinja", "--slot-save-path", "slots")
    assert cl.layer["defaults"]["chat_template"] == "{{ messages }}"
    assert cl.layer["slot_save_dir"] == str(tmp_path / "slots")  # relative to where hydrad starts
    with pytest.raises(FlagError, match=r"^--chat-template-file: no such file: x\.jinja$"):
        layer("--chat-template-file", "x.jinja")


def test_adapters_from_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server's LoRA and control-vector flags: files relative to where hydrad starts, comma-separated,
    scaled as FNAME:SCALE, each flag adding to the list; the layer range takes two values."""
    monkeypatch.chdir(tmp_path)
    for name in ("a.gguf", "b:c.gguf", "v.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    cl = layer("--lora", "a.gguf", "--lora-scaled", "b:c.gguf:0.5,a.gguf:-2", "--lora-init-without-apply",
               "--control-vector", "v.gguf", "--control-vector-scaled", "v.gguf:0.25",
               "--control-vector-layer-range", "3", "-1")
    a, bc, v = (str(tmp_path / n) for n in ("a.gguf", "b:c.gguf", "v.gguf"))
    defaults = cl.layer["defaults"]
    assert defaults["lora_adapters"] == [{"path": a, "scale": 1.0}, {"path": bc, "scale": 0.5},
                                         {"path": a, "scale": -2.0}]
    assert defaults["lora_init_without_apply"] is True
    assert defaults["control_vectors"] == [{"path": v, "scale": 1.0}, {"path": v, "scale": 0.25}]
    assert defaults["control_vector_layer_range"] == [3, 0]  # -1: to the last layer, as llama-server reads it
    assert cl.origin[("defaults", "control_vector_layer_range")] == "--control-vector-layer-range"
    params = load_config(None, cl.layer).settings.defaults
    assert params["lora_adapters"][1] == {"path": bc, "scale": 0.5}
    for argv, message in [(["--lora", "x.gguf"], "--lora: no such file: x.gguf"),
                          (["--lora-scaled", "a.gguf"], "--lora-scaled: 'a.gguf' is not FNAME:SCALE"),
                          (["--lora-scaled", "a.gguf:lots"], "--lora-scaled: needs a number, got 'lots'"),
                          (["--control-vector", " , "], "--control-vector: names no file"),
                          (["--control-vector-layer-range", "9", "3"], "--control-vector-layer-range: "
                           "control_vector_layer_range: Value error, start 9 is past end 3"),
                          (["--lora", ",".join(["a.gguf"] * 17)], "--lora: lora_adapters:")]:
        with pytest.raises(FlagError) as err:
            layer(*argv)
        assert str(err.value).startswith(message), str(err.value)


def test_a_projector_from_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server's --mmproj (-mm): a file relative to where hydrad starts, the runtime parameter mmproj."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "proj.gguf").write_bytes(b"GGUF")
    for flag in ("-mm", "--mmproj"):
        assert layer(flag, "proj.gguf").layer["defaults"]["mmproj"] == str(tmp_path / "proj.gguf")
    with pytest.raises(FlagError, match=r"^--mmproj: no such file: nowhere\.gguf$"):
        layer("--mmproj", "nowhere.gguf")


BAD_VALUES = [
    (["-c", "abc"], "-c: needs a whole number, got 'abc'"),
    (["-c", "-5"], "-c: n_ctx: Input should be greater than or equal to 0"),
    (["--port", "70000"], "--port: http.port: Input should be less than or equal to 65535"),
    (["--temp", "nan"], "--temp: needs a finite number"),
    (["--top-p", "2"], "--top-p: top_p: Input should be less than or equal to 1"),
    (["-ctk", "q3"], "-ctk: cache_type_k: Input should be"),
    (["-fa", "maybe"], "-fa: on, off or auto, got 'maybe'"),
    (["-sm", "tensor"], "-sm: 'tensor' is not served"),
    (["--pooling", "sum"], "--pooling: pooling: Input should be"),
    (["-lm", "mlock"], "-lm: 'mlock' is not served"),
    (["--load-mode", "dio"], "--load-mode: 'dio' is not served"),
    (["--host", "a.sock"], "--host: one address only"),
    (["--host", "127.0.0.1,::1"], "--host: one address only"),
    (["--cors-origins", "localhost.example"], "--cors-origins: http.cors_origins: Value error, 'localhost.example' is not an origin"),
    (["-dev", "Vulkan0"], "-dev: 'Vulkan0' is not served"),
    (["-dev", "none"], "-dev: 'none' is not served"),
    (["--rope-scale", "0"], "--rope-scale: needs a number above 0"),
    (["--repeat-last-n", "-1"], "--repeat-last-n: repeat_last_n: Input should be greater than or equal to 0"),
    (["-ot", "nope"], "-ot: override_tensors: Value error, 'nope' is not REGEX=BUFFER_TYPE"),
    (["-to", "99999"], "-to: http.header_timeout_s: Input should be less than or equal to 3600"),
]


@pytest.mark.parametrize("argv, message", BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_a_bad_value_is_refused_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError) as err:
        layer(*argv)
    assert str(err.value).startswith(message), str(err.value)


ACCEPTED = [(n, f) for f in FLAGS if f.kind == "accepted" for n in f.names]


@pytest.mark.parametrize("name, flag", ACCEPTED, ids=[n for n, _ in ACCEPTED])
def test_an_accepted_flag_changes_nothing(name: str, flag: llamaflags.Flag) -> None:
    argv = [name, "1"] if flag.takes_value() else [name]
    cl = layer(*argv)
    assert cl.layer == {} and not cl
    assert load_config(None, cl.layer).settings == EngineSettings()


REFUSED = [(n, f) for f in FLAGS if f.kind == "refused" for n in f.names]


@pytest.mark.parametrize("name, flag", REFUSED, ids=[n for n, _ in REFUSED])
def test_a_refused_flag_exits_2_naming_it_and_why(capsys: pytest.CaptureFixture[str], name: str,
                                                  flag: llamaflags.Flag) -> None:
    argv = [name, "x"] if flag.takes_value() else [name]
    assert refusal(capsys, "-c", "2048", *argv) == f"hydrad: {name}: not supported: {flag.help}\n"
    if flag.takes_value():  # without its value it is still refused for what it is
        assert refusal(capsys, name) == f"hydrad: {flag.names[-1]}: not supported: {flag.help}\n"


NEUTRAL = [(n, f) for f in FLAGS if f.kind == "neutral" for n in f.names]


@pytest.mark.parametrize("name, flag", NEUTRAL, ids=[n for n, _ in NEUTRAL])
def test_a_neutral_flag_is_accepted_at_its_neutral_values_only(capsys: pytest.CaptureFixture[str], name: str,
                                                              flag: llamaflags.Flag) -> None:
    for value in flag.neutral:
        assert layer(name, value).layer == {}
    other = "on" if flag.optional is not None else "7"
    assert other not in flag.neutral
    assert refusal(capsys, name, other) == f"hydrad: {name} {other}: not supported: {flag.help}\n"
    if flag.optional is not None:  # the flag alone means its optional value (on)
        assert refusal(capsys, name).startswith(f"hydrad: {name} {flag.optional}: not supported")


def test_neutral_numbers_compare_as_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert layer("--presence-penalty", "0.00", "--typical", "1.0", "--top-nsigma", "-1.000").layer == {}
    assert refusal(capsys, "--presence-penalty", "0.5").startswith("hydrad: --presence-penalty 0.5: not supported")


def test_an_unknown_flag_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    err = refusal(capsys, "--bogus-flag")
    assert "--bogus-flag" in err and "hydrad --help" in err
    err = refusal(capsys, "--ctx", "2048")  # no abbreviations: llama-server has none
    assert "--ctx" in err


def test_api_keys_from_the_command_line(tmp_path: Path) -> None:
    other = "o" * 24
    cl = layer("--api-key", f"{KEY},{other}")
    assert cl.api_keys == (KEY, other) and cl.layer == {}  # never in a settings layer
    assert any("--api-key" in w and "ps" in w for w in cl.warnings)
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# the team's keys\n\n  {KEY}  \n{other}\n#{'x' * 20}\n")
    assert layer("--api-key-file", str(keys)).api_keys == (KEY, other)
    keys.write_text("# only comments\n")
    with pytest.raises(FlagError, match="holds no key"):
        layer("--api-key-file", str(keys))
    keys.write_text("short\n")
    with pytest.raises(FlagError, match=r"line 1: an API key must be 16 to 256"):
        layer("--api-key-file", str(keys))
    with pytest.raises(FlagError, match=r"^--api-key: an API key must be 16 to 256"):
        layer("--api-key", "secret")


def test_api_keys_become_tenants_under_the_config_files_keys(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYDRA_API_KEY", raising=False)
    http = EngineSettings().http
    one = api_keys(http, (KEY,))
    assert one is not None and [(t.name, t.key) for t in one] == [("default", KEY)]
    two = api_keys(http, (KEY, "o" * 24))
    assert two is not None and [t.name for t in two] == ["key-1", "key-2"]
    key_file = tmp_path / "api.key"
    key_file.write_text("f" * 32 + "\n")
    from_file = api_keys(http.model_copy(update={"api_key_file": key_file}), (KEY,))
    assert from_file is not None and [t.key for t in from_file] == ["f" * 32]  # a config file's key wins
    assert api_keys(http, ()) is None
    monkeypatch.setenv("HYDRA_API_KEY", "e" * 20)
    given = api_keys(http, (KEY,))
    assert given is not None and [t.key for t in given] == [KEY]  # the command line's over the environment's


def test_the_config_file_wins_field_by_field(tmp_path: Path, gguf: Path) -> None:
    cfg = tmp_path / "engine.yaml"
    cfg.write_text(yaml.safe_dump({"http": {"port": 9999}, "defaults": {"n_ctx": 1024},
                                   "logging": {"level": "warning"}}))
    cl = layer("-m", str(gguf), "--port", "8081", "--host", "0.0.0.0", "-c", "2048", "-np", "2", "-v")
    loaded = load_config(cfg, cl.layer)
    s = loaded.settings
    assert (s.http.port, s.defaults["n_ctx"], s.logging.level) == (9999, 1024, "warning")  # the file's
    assert (s.http.host, s.defaults["n_parallel"], s.defaults["model"]) == ("0.0.0.0", 2, "tiny.gguf")  # the flags'
    assert s.models["tiny.gguf"].path == str(gguf)
    sources = loaded.sources()
    assert sources["http.port"]["source"] == "yaml" and sources["http.host"]["source"] == "flag"
    assert sources["http.max_body_bytes"]["source"] == "default"
    assert sorted(hydrad_cli._overridden(cl, loaded.raw)) == [
        "--port is overridden by the config file's http.port", "-c is overridden by the config file's defaults.n_ctx",
        "-v is overridden by the config file's logging.level"]
    # a SIGHUP re-read keeps the command line under the file
    assert load_config(cfg, loaded.flags, loaded.api_keys).settings == s


def test_the_command_line_alone(gguf: Path) -> None:
    cl = layer("-m", str(gguf), "--port", "0")
    s = load_config(None, cl.layer).settings
    assert s.http.port == 0 and s.defaults == {"model": "tiny.gguf"}


def test_main_refuses_llama_servers_environment_and_mixed_modes(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert hydrad_cli._llama_environment({"LLAMA_ARG_CTX_SIZE": "4096", "LLAMA_ARG_X": "", "PATH": "/bin",
                                          "LLAMA_API_KEY": "k"}) == ["LLAMA_API_KEY", "LLAMA_ARG_CTX_SIZE"]
    monkeypatch.setenv("LLAMA_ARG_PORT", "8081")
    assert hydrad_cli.main(["-c", "2048"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hydrad: $LLAMA_ARG_PORT: llama-server's environment variables are not read") \
        and err.count("\n") == 1
    monkeypatch.delenv("LLAMA_ARG_PORT")
    cfg = tmp_path / "e.yaml"
    cfg.write_text("name: e\n")
    assert hydrad_cli.main(["--check-config", str(cfg), "-c", "2048"]) == 2
    assert "read a file alone" in capsys.readouterr().err
    assert hydrad_cli.main(["-m", str(tmp_path / "missing.gguf")]) == 2
    assert capsys.readouterr().err == f"hydrad: -m: no such file: {tmp_path / 'missing.gguf'}\n"
