"""The model catalogue: the paper's prices, the cost formula and its units, and errors that name the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from bear.predictor.catalog import PAPER_POOL, CatalogError, UnknownModelError, parse_catalog, read_catalog
from bear.predictor.tokenizers import KNOWN_TOKENIZERS

DOCUMENT: dict[str, Any] = {"models": [
    {"name": "small", "input_usd_per_mtok": 0.1, "output_usd_per_mtok": 0.4, "num_params": 1e9,
     "max_context_tokens": 8192},
    {"name": "large", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 3.0, "num_params": "7e10",
     "max_context_tokens": 131072, "tokenizer": "pretokens"},
]}


def test_the_default_pool_is_the_papers_with_table_1_prices() -> None:
    assert PAPER_POOL.names == ("Qwen3-0.6B", "Qwen3-8B", "Qwen3-32B")
    prices = [(m.input_usd_per_mtok, m.output_usd_per_mtok) for m in PAPER_POOL]
    assert prices == [(0.044, 0.173), (0.072, 0.287), (0.287, 0.640)]
    assert all(m.tokenizer == "qwen" for m in PAPER_POOL)


def test_cost_is_prompt_and_output_tokens_at_their_prices() -> None:
    model = PAPER_POOL.spec("Qwen3-32B")
    assert model.cost_microusd(1000, 500) == pytest.approx(1000 * 0.287 + 500 * 0.640)
    assert model.cost_usd(1000, 500) == pytest.approx((1000 * 0.287 + 500 * 0.640) / 1e6)
    assert model.cost_usd(0, 0) == 0


def test_a_catalogue_parses_with_defaults_and_yaml_style_numbers() -> None:
    catalog = parse_catalog(DOCUMENT, KNOWN_TOKENIZERS)
    assert catalog.names == ("small", "large")
    assert catalog.spec("small").tokenizer == "qwen"
    assert catalog.spec("large").num_params == 7e10
    assert catalog.index("large") == 1
    assert catalog.tokenizers == ("qwen", "pretokens")


def test_read_catalog_reads_yaml(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - name: m\n    input_usd_per_mtok: 0.5\n    output_usd_per_mtok: 1.5\n"
                    "    num_params: 0.6e9\n    max_context_tokens: 4096\n")
    assert read_catalog(path, KNOWN_TOKENIZERS).spec("m").num_params == 0.6e9
    path.write_text("models: [")
    with pytest.raises(CatalogError, match="not valid YAML"):
        read_catalog(path, KNOWN_TOKENIZERS)
    path.write_text("models:\n  - name: m\n    output_usd_per_mtok: 0.5\n    output_usd_per_mtok: 1.5\n")
    with pytest.raises(CatalogError, match="(?s)models.yaml.*the key 'output_usd_per_mtok' appears a second time"):
        read_catalog(path, KNOWN_TOKENIZERS)
    # (QA: /dev/zero as the catalogue grew the process until it was killed)
    with pytest.raises(CatalogError, match=r"catalog: cannot read /dev/zero: not a regular file"):
        read_catalog(Path("/dev/zero"), KNOWN_TOKENIZERS)


def _with(path: str, value: Any) -> dict[str, Any]:
    document = copy.deepcopy(DOCUMENT)
    index, key = path.split(".")
    if value is None:
        del document["models"][int(index)][key]
    else:
        document["models"][int(index)][key] = value
    return document


@pytest.mark.parametrize(("document", "message"), [
    (_with("0.input_usd_per_mtok", None), r"models\[0\]\.input_usd_per_mtok: missing"),
    (_with("1.output_usd_per_mtok", -1), r"models\[1\]\.output_usd_per_mtok: expected a number in \[0, 1e\+06\]"),
    (_with("1.output_usd_per_mtok", 1e308), r"output_usd_per_mtok: expected a number in \[0, 1e\+06\], got 1e\+308"),
    (_with("0.num_params", 10**400), r"models\[0\]\.num_params: expected a number in \[1, 1e\+300\]"),
    (_with("0.num_params", float("nan")), r"models\[0\]\.num_params: expected a number in"),
    (_with("0.num_params", "many"), r"models\[0\]\.num_params: expected a number"),
    (_with("0.max_context_tokens", 1.5), r"models\[0\]\.max_context_tokens: expected an integer"),
    (_with("0.tokenizer", "gpt2"), r"models\[0\]\.tokenizer: unknown tokenizer 'gpt2'"),
    (_with("1.name", ""), r"models\[1\]\.name: expected a non-empty string"),
    (_with("1.name", " Qwen3-8B"), r"models\[1\]\.name: ' Qwen3-8B' has leading or trailing spaces"),
    (_with("1.name", "X,Y"), r"models\[1\]\.name: 'X,Y' holds a comma or a character that does not print"),
    (_with("1.name", "X\nY"), r"models\[1\]\.name: 'X\\nY' holds a comma"),
    (_with("0.price", 1), r"models\[0\]\.price: unknown key"),
    (_with("1.name", "small"), "model 'small' is listed twice"),
    ({"models": []}, "models: expected a non-empty list"),
    ({"pool": []}, r"catalog\.pool: unknown key"),
    ([], "catalog: expected a mapping"),
])
def test_bad_catalogues_name_the_field(document: Any, message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        parse_catalog(document, KNOWN_TOKENIZERS)


def test_an_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(UnknownModelError, match="unknown model 'gpt-5'; the catalogue has Qwen3-0.6B, Qwen3-8B"):
        PAPER_POOL.spec("gpt-5")


def test_the_example_catalogue_is_the_built_in_pool() -> None:
    example = Path(__file__).resolve().parents[3] / "docs" / "examples" / "predictor-catalog.yaml"
    assert read_catalog(example, KNOWN_TOKENIZERS) == PAPER_POOL
