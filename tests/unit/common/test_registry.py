"""The model registry: loading models.yaml, resolving aliases and paths, errors that name things."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hydrad.common.registry import ModelEntry, Registry, ResolvedModel, UnknownModel

REPO = Path(__file__).resolve().parents[3]
MODELS_YAML = REPO / "etc" / "hydra" / "models.yaml"
SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"


def fake_gguf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF\x03\x00\x00\x00")  # resolve() only checks that the file exists
    return path


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    fake_gguf(d / SMOLLM_FILE)
    fake_gguf(d / GEMMA_FILE)
    return d


@pytest.fixture
def registry(models_dir: Path) -> Registry:
    return Registry.load(MODELS_YAML, models_dir)


def write_registry(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "models.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def load_error(path: Path, models_dir: Path | None = None) -> str:
    with pytest.raises(ValueError) as ei:
        Registry.load(path, models_dir or path.parent)
    return str(ei.value)


# --------------------------------------------------------------------------- loading


def test_load_shipped_registry(registry: Registry, models_dir: Path) -> None:
    assert registry.models_dir == models_dir
    assert set(registry.entries) == {"smollm2-135m", "gemma3-270m"}
    smol = registry.entries["smollm2-135m"]
    assert isinstance(smol, ModelEntry)
    assert smol.path == SMOLLM_FILE
    assert (smol.arch, smol.quant) == ("llama", "Q4_1")
    assert smol.size_bytes and smol.size_bytes > 0
    assert smol.kv_bytes_per_token and smol.kv_bytes_per_token > 0
    assert smol.defaults == {"n_ctx": 8192}
    assert registry.entries["gemma3-270m"].arch == "gemma3"


def test_load_none_is_empty(tmp_path: Path) -> None:
    reg = Registry.load(None, tmp_path)
    assert reg.entries == {} and reg.models_dir == tmp_path


def test_load_empty_file(tmp_path: Path) -> None:
    assert Registry.load(write_registry(tmp_path, "# empty\n"), tmp_path).entries == {}


def test_load_bare_mapping_without_models_key_is_refused(tmp_path: Path) -> None:
    p = write_registry(tmp_path, "tiny:\n  path: tiny.gguf\n")
    msg = load_error(p)
    assert str(p) in msg and "tiny" in msg


def test_missing_registry_file(tmp_path: Path) -> None:
    p = tmp_path / "nope.yaml"
    msg = load_error(p)
    assert str(p) in msg and "cannot read" in msg


def test_bad_yaml_registry(tmp_path: Path) -> None:
    p = write_registry(tmp_path, "models:\n  a: [unclosed\n")
    msg = load_error(p)
    assert str(p) in msg and "not valid YAML" in msg


def test_list_registry_refused(tmp_path: Path) -> None:
    p = write_registry(tmp_path, "- a.gguf\n- b.gguf\n")
    msg = load_error(p)
    assert str(p) in msg and "models" in msg


def test_unknown_field_in_entry_named(tmp_path: Path) -> None:
    p = write_registry(tmp_path, """\
        models:
          tiny:
            path: tiny.gguf
            quantisation: Q4_0
        """)
    msg = load_error(p)
    assert str(p) in msg
    assert "models.tiny.quantisation" in msg and "unknown field" in msg


def test_entry_without_path_named(tmp_path: Path) -> None:
    p = write_registry(tmp_path, "models:\n  tiny:\n    arch: llama\n")
    assert "models.tiny.path" in load_error(p)


def test_negative_size_named(tmp_path: Path) -> None:
    p = write_registry(tmp_path, "models:\n  tiny:\n    path: t.gguf\n    size_bytes: -1\n")
    assert "models.tiny.size_bytes" in load_error(p)


@pytest.mark.parametrize(("defaults", "field"), [
    ("{n_ctx: -1}", "n_ctx"),
    ("{flash_attn: maybe}", "flash_attn"),
    ("{n_ctxx: 10}", "n_ctxx"),
    ("{http: {port: 1}}", "http"),
])
def test_invalid_defaults_named(tmp_path: Path, defaults: str, field: str) -> None:
    p = write_registry(tmp_path, f"models:\n  tiny:\n    path: t.gguf\n    defaults: {defaults}\n")
    msg = load_error(p)
    assert str(p) in msg
    assert "models.tiny.defaults" in msg and field in msg


def test_defaults_cannot_name_a_model(tmp_path: Path) -> None:
    p = write_registry(tmp_path, "models:\n  tiny:\n    path: t.gguf\n    defaults: {model: other}\n")
    msg = load_error(p)
    assert "models.tiny.defaults" in msg and "another model" in msg


def test_non_string_top_level_key_is_value_error(tmp_path: Path) -> None:
    p = write_registry(tmp_path, "models: {}\n1: stray\n")
    assert str(p) in load_error(p)


def test_non_utf8_registry_names_file(tmp_path: Path) -> None:
    p = tmp_path / "models.yaml"
    p.write_bytes("models:\n  caf\xe9:\n    path: c.gguf\n".encode("latin-1"))
    assert str(p) in load_error(p)


def test_defaults_for(registry: Registry) -> None:
    assert registry.defaults_for("smollm2-135m") == {"n_ctx": 8192}
    assert registry.defaults_for("unknown") == {}
    assert registry.defaults_for(SMOLLM_FILE) == {}  # keyed by alias only
    registry.defaults_for("smollm2-135m")["n_ctx"] = 1
    assert registry.entries["smollm2-135m"].defaults == {"n_ctx": 8192}  # a copy


# --------------------------------------------------------------------------- resolving


def test_resolve_alias(registry: Registry, models_dir: Path) -> None:
    r = registry.resolve("smollm2-135m")
    assert isinstance(r, ResolvedModel)
    assert r.alias == "smollm2-135m"
    assert r.path == models_dir / SMOLLM_FILE
    assert r.entry is registry.entries["smollm2-135m"]
    assert r.id == "smollm2-135m"


def test_resolve_alias_with_absolute_path(tmp_path: Path) -> None:
    f = fake_gguf(tmp_path / "elsewhere" / "abs.gguf")
    reg = Registry(tmp_path / "models", {"abs": ModelEntry(path=str(f))})
    r = reg.resolve("abs")
    assert r.path == f and r.alias == "abs"


def test_resolve_relative_path_of_registered_file_finds_alias(registry: Registry, models_dir: Path) -> None:
    r = registry.resolve(GEMMA_FILE)
    assert r.path == models_dir / GEMMA_FILE
    assert r.alias == "gemma3-270m"
    assert r.entry is registry.entries["gemma3-270m"]
    assert r.id == "gemma3-270m"


def test_resolve_relative_unregistered_path(registry: Registry, models_dir: Path) -> None:
    fake_gguf(models_dir / "sub" / "Other-Model.Q8_0.gguf")
    r = registry.resolve("sub/Other-Model.Q8_0.gguf")
    assert r.path == models_dir / "sub" / "Other-Model.Q8_0.gguf"
    assert r.alias is None and r.entry is None
    assert r.id == "Other-Model.Q8_0"


def test_resolve_absolute_path(registry: Registry, tmp_path: Path) -> None:
    f = fake_gguf(tmp_path / "outside" / "free.gguf")
    r = registry.resolve(str(f))
    assert r.path == f and r.alias is None and r.entry is None
    assert r.id == "free"


def test_resolve_absolute_path_of_registered_file_finds_alias(registry: Registry, models_dir: Path) -> None:
    r = registry.resolve(str(models_dir / SMOLLM_FILE))
    assert r.alias == "smollm2-135m"


def test_alias_with_missing_file_names_path(tmp_path: Path) -> None:
    empty = tmp_path / "empty-models"
    empty.mkdir()
    reg = Registry.load(MODELS_YAML, empty)
    with pytest.raises(UnknownModel) as ei:
        reg.resolve("gemma3-270m")
    msg = str(ei.value)
    assert "gemma3-270m" in msg
    assert str(empty / GEMMA_FILE) in msg
    assert "missing" in msg


def test_unknown_name_lists_aliases(registry: Registry, models_dir: Path) -> None:
    with pytest.raises(UnknownModel) as ei:
        registry.resolve("llama-70b")
    msg = str(ei.value)
    assert "llama-70b" in msg
    assert "gemma3-270m, smollm2-135m" in msg
    assert str(models_dir) in msg


def test_unknown_name_with_empty_registry(tmp_path: Path) -> None:
    with pytest.raises(UnknownModel) as ei:
        Registry(tmp_path).resolve("x")
    assert "none registered" in str(ei.value)


def test_unknown_model_is_lookup_error() -> None:
    assert issubclass(UnknownModel, LookupError)


@pytest.mark.parametrize("name", ["", ".", "notes.txt", "sub", "missing.gguf"])
def test_non_gguf_or_missing_paths_are_unknown(registry: Registry, models_dir: Path, name: str) -> None:
    (models_dir / "notes.txt").write_text("x")
    (models_dir / "sub").mkdir(exist_ok=True)
    with pytest.raises(UnknownModel):
        registry.resolve(name)


def test_directory_named_like_gguf_is_unknown(registry: Registry, models_dir: Path) -> None:
    (models_dir / "dir.gguf").mkdir()
    with pytest.raises(UnknownModel):
        registry.resolve("dir.gguf")


# --------------------------------------------------------------------------- names


def test_names_of_alias(registry: Registry, models_dir: Path) -> None:
    r = registry.resolve("smollm2-135m")
    path = models_dir / SMOLLM_FILE
    assert r.names() == {"smollm2-135m", SMOLLM_FILE, "SmolLM2-135M-Instruct.Q4_1", str(path)}


def test_names_without_alias(registry: Registry, tmp_path: Path) -> None:
    f = fake_gguf(tmp_path / "x" / "solo.gguf")
    r = registry.resolve(str(f))
    assert r.names() == {"solo", "solo.gguf", str(f)}


# --------------------------------------------------------------------------- aliases (llama-server's --alias)


def test_aliases_name_their_entry(tmp_path: Path, models_dir: Path) -> None:
    p = write_registry(tmp_path, f"""
        models:
          smollm2-135m:
            path: {SMOLLM_FILE}
            aliases: [gpt-4o-mini, my-model]
          gemma3-270m:
            path: {GEMMA_FILE}
        """)
    reg = Registry.load(p, models_dir)
    r = reg.resolve("gpt-4o-mini")
    assert (r.id, r.alias, r.path) == ("smollm2-135m", "smollm2-135m", models_dir / SMOLLM_FILE)
    assert r.aliases == ("gpt-4o-mini", "my-model")
    assert r.names() == {"smollm2-135m", "gpt-4o-mini", "my-model", SMOLLM_FILE, SMOLLM_FILE[:-5],
                         str(models_dir / SMOLLM_FILE)}
    for name in ("smollm2-135m", "my-model", SMOLLM_FILE, SMOLLM_FILE[:-5]):
        assert reg.key_of(name) == "smollm2-135m", name
    assert reg.key_of(GEMMA_FILE) == "gemma3-270m" and reg.key_of("nope") is None
    assert reg.resolve("gemma3-270m").aliases == ()


@pytest.mark.parametrize("text, named", [
    ("a: {path: a.gguf, aliases: [x]}\n  b: {path: b.gguf, aliases: [x]}", "'x' names both 'a' and 'b'"),
    ("a: {path: a.gguf}\n  b: {path: b.gguf, aliases: [a]}", "'a' names both 'a' and 'b'"),
    ("a: {path: a.gguf, aliases: ['']}", "models.a.aliases.0"),
])
def test_an_alias_means_one_model(tmp_path: Path, text: str, named: str) -> None:
    p = tmp_path / "models.yaml"
    p.write_text("models:\n  " + text + "\n")
    msg = load_error(p)
    assert str(p) in msg and named in msg, msg


def test_an_engines_own_entries_lie_over_the_file(models_dir: Path, tmp_path: Path) -> None:
    own = {"mine": ModelEntry(path=str(models_dir / GEMMA_FILE), aliases=["g"]),
           "smollm2-135m": ModelEntry(path=str(models_dir / GEMMA_FILE))}
    reg = Registry.load(MODELS_YAML, models_dir, own)
    assert set(reg.entries) == {"smollm2-135m", "gemma3-270m", "mine"}
    assert reg.resolve("g").id == "mine" and reg.resolve("smollm2-135m").path == models_dir / GEMMA_FILE
    with pytest.raises(ValueError, match=r"^models: 'gemma3-270m' names both 'gemma3-270m' and 'x'"):
        Registry.load(MODELS_YAML, models_dir, {"x": ModelEntry(path="x.gguf", aliases=["gemma3-270m"])})


def test_a_missing_file_resolves_as_fetchable_only_with_size_sha_and_a_source(tmp_path: Path) -> None:
    sha = "ab" * 32
    reg = Registry(tmp_path, {"full": ModelEntry(path="f.gguf", size_bytes=10, sha256=sha),
                              "bare": ModelEntry(path="b.gguf")})
    r = reg.resolve("full", fetchable=True)
    assert r.fetch and r.path == tmp_path / "f.gguf"
    with pytest.raises(UnknownModel, match="file is missing"):
        reg.resolve("full")  # no source to fetch from
    with pytest.raises(UnknownModel, match="size_bytes and sha256"):
        reg.resolve("bare", fetchable=True)
    (tmp_path / "f.gguf").write_bytes(b"GGUF")
    assert not reg.resolve("full", fetchable=True).fetch  # on disk: loaded as it is


def test_sha256_must_be_64_lower_case_hex_digits(tmp_path: Path) -> None:
    p = write_registry(tmp_path, "models:\n  tiny:\n    path: t.gguf\n    sha256: ABC\n")
    assert "models.tiny.sha256" in load_error(p)
