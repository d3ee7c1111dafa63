"""The model registry (``etc/hydra/models.yaml``): alias → GGUF file and what is known about it.

Engines use it to resolve a ``model`` parameter; the coordinator uses the same entries to check
profiles against it and to route requests by model name. An unknown model is an error that lists
what is known, never a silent fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from hydrad.common.yamlfile import read_mapping
from hydrad.common.params import check_partial, validation_message


class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="GGUF file, relative to the engine's models_dir unless absolute.")
    arch: str | None = Field(None, description="Architecture as the GGUF names it (llama, gemma3, ...).")
    quant: str | None = Field(None, description="Weight quantization (Q4_1, Q4_K_M, ...).")
    size_bytes: int | None = Field(None, ge=0, description="File size, for placement before the file is opened; with "
                                   "sha256, an engine that lacks the file may fetch it from the coordinator.")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the file (64 lower-case hex "
                               "digits). With size_bytes it makes the model fetchable: an engine whose models_dir "
                               "lacks the file fetches it from the coordinator and checks it against this before "
                               "loading. Without them the entry serves models already on disk.")
    kv_bytes_per_token: int | None = Field(None, ge=0, description="KV cache bytes per token at f16, for placement.")
    description: str = Field("", description="Free text shown by /v1/models.")
    aliases: list[Annotated[str, StringConstraints(min_length=1, max_length=256)]] = Field(
        default_factory=list, max_length=64,
        description="More names a request's model field may use for this model, besides its key and its file's "
                    "name and stem (llama-server's --alias, comma-separated there). /v1/models lists them.")
    defaults: dict[str, Any] = Field(default_factory=dict, description="Runtime parameters this model should run with.")

    @field_validator("defaults")
    @classmethod
    def _defaults(cls, v: dict[str, Any]) -> dict[str, Any]:
        v = check_partial(v)
        if "model" in v:
            raise ValueError("a model's defaults cannot name another model")
        return v


class RegistryFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: dict[str, ModelEntry] = Field(default_factory=dict, description="Alias → model entry.")

    @model_validator(mode="after")
    def _names_unique(self) -> "RegistryFile":
        check_names(self.models)
        return self


def check_names(entries: dict[str, ModelEntry]) -> None:
    """Every name (an entry's key or one of its aliases) means one model: ValueError naming the
    first that means two, since a request naming it could not say which it wants."""
    owner: dict[str, str] = {}
    for key, entry in entries.items():
        for name in (key, *entry.aliases):
            other = owner.setdefault(name, key)
            if other != key:
                raise ValueError(f"'{name}' names both '{other}' and '{key}' (an alias must be unique in the registry)")


class UnknownModel(LookupError):
    """The name is neither an alias nor an existing GGUF file."""


@dataclass(frozen=True)
class ResolvedModel:
    alias: str | None
    path: Path
    entry: ModelEntry | None
    models_dir: Path | None = None  # where the adapters a load names (lora_adapters, control_vectors) are looked up
    fetch: bool = False  # the file is not here yet: the load fetches it from the pool first (entry has size and sha256)

    @property
    def id(self) -> str:
        """The name the OpenAI API reports: the alias when there is one, else the file's stem."""
        return self.alias or self.path.stem

    @property
    def aliases(self) -> tuple[str, ...]:
        """The entry's further names (llama-server's ``--alias``), in their order."""
        return tuple(self.entry.aliases) if self.entry is not None else ()

    def names(self) -> set[str]:
        """Names a request's ``model`` field may use for this model."""
        out = {self.id, self.path.name, self.path.stem, str(self.path), *self.aliases}
        if self.alias:
            out.add(self.alias)
        return out


class Registry:
    def __init__(self, models_dir: Path, entries: dict[str, ModelEntry] | None = None) -> None:
        self.models_dir = models_dir
        self.entries = entries or {}
        self._by_alias = {a: key for key, e in self.entries.items() for a in e.aliases}

    @classmethod
    def load(cls, path: Path | None, models_dir: Path, own: dict[str, ModelEntry] | None = None) -> "Registry":
        """The registry file's entries, with ``own`` (an engine's ``models`` setting: what ``-m`` and
        ``--alias`` make) over them; ValueError naming the file, or the name two entries claim."""
        entries: dict[str, ModelEntry] = {}
        if path is not None:
            raw = read_mapping(path, "a mapping with a 'models' key")
            try:
                entries = RegistryFile(**raw).models
            except ValidationError as exc:
                raise ValueError(validation_message(exc, str(path))[0]) from None
        if own:
            entries = {**entries, **own}
            try:
                check_names(entries)
            except ValueError as exc:
                raise ValueError(f"models: {exc}") from None
        return cls(models_dir, entries)

    def key_of(self, name: str) -> str | None:
        """The entry a request's ``model`` names (its key, an alias, its file's path, name or stem), or None."""
        if name in self.entries:
            return name
        if name in self._by_alias:
            return self._by_alias[name]
        for key, entry in self.entries.items():
            p = Path(entry.path)
            if name in (entry.path, p.name, p.stem):
                return key
        return None

    def defaults_for(self, model: str) -> dict[str, Any]:
        entry = self.entries.get(model)
        return dict(entry.defaults) if entry else {}

    def resolve(self, name: str, fetchable: bool = False) -> ResolvedModel:
        """The model a name means. A registered model whose file is missing is an ``UnknownModel``, unless
        ``fetchable`` (this engine can fetch files from its pool) and the entry says what the file is
        (``size_bytes`` and ``sha256``): then it resolves with ``fetch`` set, and the load fetches it."""
        name = self._by_alias.get(name, name)
        entry = self.entries.get(name)
        if entry is not None:
            p = Path(entry.path)
            path = p if p.is_absolute() else self.models_dir / p
            if not path.is_file():
                if fetchable and not p.is_absolute() and entry.sha256 and entry.size_bytes:
                    return ResolvedModel(name, path, entry, self.models_dir, fetch=True)
                how = "" if entry.sha256 and entry.size_bytes else \
                    " (an entry with size_bytes and sha256 can be fetched from the coordinator)"
                raise UnknownModel(f"model '{name}' is registered but its file is missing: {path}{how}")
            return ResolvedModel(name, path, entry, self.models_dir)
        p = Path(name)
        for candidate in ([p] if p.is_absolute() else [self.models_dir / p]):
            if candidate.is_file() and candidate.suffix == ".gguf":
                alias = next((a for a, e in self.entries.items()
                              if (self.models_dir / e.path).resolve() == candidate.resolve()), None)
                return ResolvedModel(alias, candidate, self.entries.get(alias) if alias else None, self.models_dir)
        known = ", ".join(sorted(self.entries)) or "none registered"
        raise UnknownModel(f"unknown model '{name}': not a registry alias ({known}) nor a .gguf file under {self.models_dir}")
