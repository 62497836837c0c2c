"""The committed derived tables are exactly what the extraction script makes of AIConfigurator's Parquet files.

Needs the source copy (`../shared/data/aiconfigurator_h100`, next to the checkout) and pyarrow; skipped without them,
since the runtime never reads the source.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bear.evaluation.kernel_tables import load_tables
from bear.evaluation.model_shapes import HF_CONFIG_FILES, SUPPORTED
from bear.evaluation.tools import extract_h100_tables

SOURCE = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "aiconfigurator_h100"
pytestmark = pytest.mark.skipif(not (SOURCE / "h100_sxm").is_dir(), reason=f"no AIConfigurator copy at {SOURCE}")


def test_the_committed_file_is_reproduced_by_the_extraction_script(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    output = tmp_path / "tables.npz"
    assert extract_h100_tables.main([str(SOURCE), str(output)]) == 0
    with np.load(output, allow_pickle=False) as fresh:
        committed = load_tables().raw
        assert sorted(fresh.files) == sorted(committed)
        for name in fresh.files:
            np.testing.assert_array_equal(fresh[name], committed[name], err_msg=name)


def test_model_shapes_match_the_hugging_face_configs() -> None:
    for shape in {s.model for s in SUPPORTED.values()}:
        config = json.loads((SOURCE / "model_configs" / HF_CONFIG_FILES[shape.name]).read_text())
        assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"],
                config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"],
                config["vocab_size"]) == (shape.num_layers, shape.hidden_size, shape.intermediate_size,
                                          shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim,
                                          shape.vocab_size)


def test_grid_brackets_are_what_interpolation_reads() -> None:
    axis = [1024, 4096, 16384, 65536]
    assert extract_h100_tables.bracket(4096, axis) == [4096]
    assert extract_h100_tables.bracket(5000, axis) == [4096, 16384]
    assert extract_h100_tables.bracket(151_936, axis) == [65536]
    with pytest.raises(ValueError, match="below the table grid"):
        extract_h100_tables.bracket(10, axis)
