"""The model catalogue: what the predictor knows about each model of the pool, and the cost of a request on it.

Prices are USD per million tokens (the unit of the paper's Table 1 and of providers' price lists). The cost of one
request (Appendix A.4) is

    cost_usd = prompt_tokens · input_usd_per_mtok / 1e6 + output_tokens · output_usd_per_mtok / 1e6

The router's utility (eq. 4) counts cost in micro-dollars, tokens × USD per million tokens: `cost_microusd`.

A catalogue is data: the paper's pool is built in (`PAPER_POOL`), an operator replaces it with a YAML file whose every
field is checked (`parse_catalog`; a CatalogError names the field).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bear.common.messages import shown
from bear.common.prices import MAX_USD_PER_MTOK

TOKENS_PER_MTOK = 1_000_000
MAX_NUMBER = 1e300  # the catalogue's other numbers: finite, with room for the features' arithmetic
DEFAULT_TOKENIZER = "qwen"


class CatalogError(ValueError):
    """A catalogue that cannot be read; the message starts with the offending field's path."""


class UnknownModelError(KeyError):
    """A model name that is not in the catalogue."""

    def __str__(self) -> str:  # KeyError quotes its argument; the message is already a sentence
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model of the pool."""

    name: str
    input_usd_per_mtok: float  # price of prompt tokens, USD per million
    output_usd_per_mtok: float  # price of output tokens, USD per million
    num_params: float  # parameter count (a feature: its logarithm)
    max_context_tokens: int  # longest prompt + output the model serves (a feature of the models)
    tokenizer: str = DEFAULT_TOKENIZER  # counts this model's prompt tokens (bear.predictor.tokenizers)

    def cost_usd(self, prompt_tokens: float, output_tokens: float) -> float:
        return self.cost_microusd(prompt_tokens, output_tokens) / TOKENS_PER_MTOK

    def cost_microusd(self, prompt_tokens: float, output_tokens: float) -> float:
        """Tokens × USD per million tokens: the unit of the router's utility (eq. 4)."""
        return prompt_tokens * self.input_usd_per_mtok + output_tokens * self.output_usd_per_mtok


@dataclass(frozen=True, slots=True)
class Catalog:
    """The models of a pool, in a fixed order (a model's position is its categorical id)."""

    models: tuple[ModelSpec, ...]

    def __post_init__(self) -> None:
        if not self.models:
            raise CatalogError("models: the catalogue lists no model")
        names = [m.name for m in self.models]
        for name in names:
            if names.count(name) > 1:
                raise CatalogError(f"models: model {name!r} is listed twice")

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    def spec(self, name: str) -> ModelSpec:
        for model in self.models:
            if model.name == name:
                return model
        raise UnknownModelError(f"unknown model {shown(name)}; the catalogue has {', '.join(self.names)}")

    def resolve(self, model: str) -> str:
        """The catalogue's name of `model`: its own, or that of a repository id `org/name` whose `name` is in the
        catalogue (`Qwen/Qwen3-8B` → `Qwen3-8B`, as clients and vLLM name models)."""
        try:
            return self.spec(model).name
        except UnknownModelError:
            short = model.rsplit("/", 1)[-1]
            if short != model and short in self.names:
                return short
            raise

    def index(self, name: str) -> int:
        """The model's categorical id."""
        return self.names.index(self.spec(name).name)

    @property
    def tokenizers(self) -> tuple[str, ...]:
        """The distinct tokenizers of the pool, in first-use order."""
        return tuple(dict.fromkeys(m.tokenizer for m in self.models))

    def to_json(self) -> dict[str, Any]:
        return {"models": [asdict(m) for m in self.models]}


# The paper's pool. Prices: Table 1 (Alibaba Cloud Model Studio, non-thinking mode). Parameter counts and context
# lengths: the Qwen3 model cards (0.6B: 32,768 tokens; 8B and 32B: 131,072 with YaRN, 32,768 natively).
PAPER_POOL = Catalog((
    ModelSpec("Qwen3-0.6B", input_usd_per_mtok=0.044, output_usd_per_mtok=0.173, num_params=0.6e9,
              max_context_tokens=32_768),
    ModelSpec("Qwen3-8B", input_usd_per_mtok=0.072, output_usd_per_mtok=0.287, num_params=8.2e9,
              max_context_tokens=131_072),
    ModelSpec("Qwen3-32B", input_usd_per_mtok=0.287, output_usd_per_mtok=0.640, num_params=32.8e9,
              max_context_tokens=131_072),
))

_REQUIRED = ("name", "input_usd_per_mtok", "output_usd_per_mtok", "num_params", "max_context_tokens")
_OPTIONAL = ("tokenizer",)


def parse_catalog(document: Any, known_tokenizers: Sequence[str]) -> Catalog:
    """A catalogue from decoded YAML or JSON: `{"models": [{name, input_usd_per_mtok, output_usd_per_mtok,
    num_params, max_context_tokens, tokenizer (optional)}]}`."""
    if not isinstance(document, Mapping):
        raise CatalogError(f"catalog: expected a mapping with key 'models', got {type(document).__name__}")
    unknown = sorted(set(document) - {"models"})
    if unknown:
        raise CatalogError(f"catalog.{unknown[0]}: unknown key (expected only 'models')")
    items = document.get("models")
    if not isinstance(items, list) or not items:
        raise CatalogError("models: expected a non-empty list of models")
    return Catalog(tuple(_model(item, f"models[{i}]", known_tokenizers) for i, item in enumerate(items)))


def _model(item: Any, path: str, known_tokenizers: Sequence[str]) -> ModelSpec:
    if not isinstance(item, Mapping):
        raise CatalogError(f"{path}: expected a mapping, got {type(item).__name__}")
    for key in _REQUIRED:
        if key not in item:
            raise CatalogError(f"{path}.{key}: missing")
    for key in item:
        if key not in _REQUIRED and key not in _OPTIONAL:
            raise CatalogError(f"{path}.{key}: unknown key")
    name = item["name"]
    if not isinstance(name, str) or not name.strip():
        raise CatalogError(f"{path}.name: expected a non-empty string")
    if name != name.strip():
        raise CatalogError(f"{path}.name: {name!r} has leading or trailing spaces (it would be another model than "
                           f"{name.strip()!r})")
    if "," in name or not name.isprintable():  # lists of models are comma-separated (--models, BEAR_* settings)
        raise CatalogError(f"{path}.name: {name!r} holds a comma or a character that does not print")
    tokenizer = item.get("tokenizer", DEFAULT_TOKENIZER)
    if tokenizer not in known_tokenizers:
        raise CatalogError(f"{path}.tokenizer: unknown tokenizer {tokenizer!r}; known: {', '.join(known_tokenizers)}")
    context = _number(item, "max_context_tokens", path, minimum=1.0)
    if context != int(context):
        raise CatalogError(f"{path}.max_context_tokens: expected an integer, got {item['max_context_tokens']!r}")
    return ModelSpec(
        name=name,
        input_usd_per_mtok=_number(item, "input_usd_per_mtok", path, minimum=0.0, maximum=MAX_USD_PER_MTOK),
        output_usd_per_mtok=_number(item, "output_usd_per_mtok", path, minimum=0.0, maximum=MAX_USD_PER_MTOK),
        num_params=_number(item, "num_params", path, minimum=1.0),
        max_context_tokens=int(context),
        tokenizer=tokenizer,
    )


def _number(item: Mapping[str, Any], key: str, path: str, minimum: float, maximum: float = MAX_NUMBER) -> float:
    raw = item[key]
    if isinstance(raw, str):  # YAML 1.1 reads 0.6e9 as a string
        try:
            raw = float(raw)
        except ValueError:
            raise CatalogError(f"{path}.{key}: expected a number, got {shown(item[key])}") from None
    try:
        value = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else math.nan
    except OverflowError:  # an integer beyond any float
        value = math.nan
    if not minimum <= value <= maximum:  # also refuses nan and inf
        raise CatalogError(f"{path}.{key}: expected a number in [{minimum:g}, {maximum:g}], got {shown(item[key])}")
    return value


def read_catalog(path: Path, known_tokenizers: Sequence[str]) -> Catalog:
    """A catalogue from a YAML (or JSON) file."""
    import yaml

    from bear.common.yaml_files import load_yaml, read_settings_file

    try:
        document = load_yaml(read_settings_file(path))
    except OSError as error:
        raise CatalogError(f"catalog: cannot read {path}: {error.strerror or error}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise CatalogError(f"catalog: {path} is not valid YAML: {error}") from None
    return parse_catalog(document, known_tokenizers)
