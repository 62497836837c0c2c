"""The evaluation table in its three formats, and a clear error naming the column and row for every bad input."""

from __future__ import annotations

import decimal
import json
from pathlib import Path

import numpy as np
import pytest

from bear.predictor.evals import EvalsError, read_eval_table, table_from_columns, write_eval_table
from tests.predictor_builders import make_table

TRICKY = ('He said "hi",\nthen left.', "naïve, 50 words", "plain")


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_a_table_survives_writing_and_reading(tmp_path: Path, suffix: str) -> None:
    table = make_table(TRICKY, ["a", "b", "a"], [0.0, 0.55, 1.0], [1, 250, 4096], ["t1", "t2", "t1"])
    path = tmp_path / f"evals{suffix}"
    write_eval_table(table, path, {"source": ["synthetic"] * 3})
    back = read_eval_table(path)
    assert back.prompts == TRICKY and back.models == ("a", "b", "a") and back.tasks == ("t1", "t2", "t1")
    assert np.array_equal(back.scores, table.scores) and np.array_equal(back.output_tokens, table.output_tokens)


def test_task_is_optional() -> None:
    table = table_from_columns({"prompt": ["p"], "model": ["m"], "score": [0.5], "output_tokens": [3.0]})
    assert table.tasks is None and table.output_tokens.tolist() == [3]
    some = table_from_columns({"prompt": ["p"] * 4, "model": ["m"] * 4, "score": [0.5] * 4, "output_tokens": [3] * 4,
                               "task": ["qa", None, "", float("nan")]})
    assert some.tasks == ("qa", "", "", "")


def test_files_as_tools_write_them_are_read(tmp_path: Path) -> None:
    # A spreadsheet's byte-order mark; a long-document prompt over csv's default 128 KiB field limit; JSON strings
    # holding U+2028 / U+0085 raw (json.dumps(ensure_ascii=False) writes them so; they are no line ends in JSON Lines).
    long_prompt = "word " * 30_000
    (tmp_path / "bom.csv").write_text(f"prompt,model,score,output_tokens\n{long_prompt},m,0.5,12\n",
                                      encoding="utf-8-sig")
    table = read_eval_table(tmp_path / "bom.csv")
    assert table.prompts == (long_prompt,) and table.models == ("m",)
    rows = [{"prompt": "Price list\x85item one\u2028two", "model": "m", "score": 1, "output_tokens": 4}] * 2
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                        encoding="utf-8-sig")
    assert read_eval_table(tmp_path / "raw.jsonl").prompts == ("Price list\x85item one\u2028two",) * 2


@pytest.mark.parametrize(("column", "value", "message"), [
    ("score", float("nan"), "evals row 2: score is NaN"),
    ("score", 7, r"evals row 2: score 7.0 is outside \[0, 1\]"),
    ("score", None, "evals row 2: score must be a number, got None"),
    ("score", "0.5", "evals row 2: score must be a number"),
    ("output_tokens", 12.5, r"evals row 2: output_tokens must be an integer in \[1, 1000000000\], got 12.5"),
    ("output_tokens", 0, "evals row 2: output_tokens must be an integer in"),
    ("output_tokens", 10**20, "evals row 2: output_tokens must be an integer in"),  # beyond int64 too
    ("prompt", "  ", "evals row 2: prompt must be a non-empty string"),
    ("model", 3, "evals row 2: model must be a non-empty string, got 3"),
    ("task", 5, "evals row 2: task must be a string, got 5"),
    ("output_tokens", 10**400, "evals row 2: output_tokens must be a number of a sensible size"),  # JSON Lines has it
    ("score", b"\x00" * 20_000, r"evals row 2: score must be a number, got b'\\x00.*… \(a bytes\)$"),  # cut short
    ("prompt", "a lone surrogate \ud800", "evals row 2: prompt is not valid Unicode text"),  # JSON's "\ud800"
    ("model", "m\udcff", "evals row 2: model is not valid Unicode text"),
    ("score", decimal.Decimal("sNaN"), "evals row 2: score must be a number"),
])
def test_bad_values_name_the_row_and_column(column: str, value: object, message: str) -> None:
    columns: dict[str, list[object]] = {"prompt": ["p", "q"], "model": ["m", "m"], "score": [0.5, 0.5],
                                        "output_tokens": [10, 10], "task": ["t", "t"]}
    columns[column][1] = value
    with pytest.raises(EvalsError, match=message):
        table_from_columns(columns)


def test_decimal_numbers_of_sql_exports_are_numbers() -> None:
    columns: dict[str, list[object]] = {"prompt": ["p"], "model": ["m"], "score": [decimal.Decimal("0.750")],
                                        "output_tokens": [decimal.Decimal("12")]}
    table = table_from_columns(columns)
    assert table.scores.tolist() == [0.75] and table.output_tokens.tolist() == [12]


@pytest.mark.parametrize("text", ["1_000", "0_5"])
def test_a_text_number_with_an_underscore_is_no_number(text: str) -> None:
    columns: dict[str, list[object]] = {"prompt": ["p"], "model": ["m"], "score": ["0.5"], "output_tokens": ["12"]}
    columns["output_tokens" if text == "1_000" else "score"][0] = text
    with pytest.raises(EvalsError, match=f"must be a number, got '{text}'"):
        table_from_columns(columns, from_text=True)


@pytest.mark.parametrize(("text", "message"), [
    ("prompt,model,score,score,output_tokens\np,m,0.1,0.9,3\n", "column 'score' appears more than once"),
    ("prompt,model,score,output_tokens\np,m,0.5,3,extra\n", "line 2 has 5 fields, the header 4"),
])
def test_a_csv_whose_fields_do_not_line_up_with_its_header_is_refused(tmp_path: Path, text: str,
                                                                       message: str) -> None:
    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(EvalsError, match=message):
        read_eval_table(tmp_path / "t.csv")


def test_blank_lines_in_a_csv_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("prompt,model,score,output_tokens\n\np,m,0.5,3\n\n")
    assert read_eval_table(tmp_path / "t.csv").prompts == ("p",)


@pytest.mark.parametrize("missing", ["prompt", "model", "score", "output_tokens"])
def test_a_missing_column_is_named(missing: str) -> None:
    columns = {"prompt": ["p"], "model": ["m"], "score": [0.5], "output_tokens": [10]}
    del columns[missing]
    with pytest.raises(EvalsError, match=f"evals: missing column '{missing}'"):
        table_from_columns(columns)


def test_csv_values_are_parsed_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "evals.csv"
    path.write_text("prompt,model,score,output_tokens\nhello,m,0.25,12\nworld,m,nan,12\n")
    with pytest.raises(EvalsError, match="evals row 2: score is NaN"):
        read_eval_table(path)
    path.write_text("prompt,model,output_tokens\nhello,m,12\n")
    with pytest.raises(EvalsError, match="missing column 'score'"):
        read_eval_table(path)
    path.write_text("prompt,model,score,output_tokens\n")
    with pytest.raises(EvalsError, match="no rows"):
        read_eval_table(path)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(EvalsError, match="unknown format"):
        read_eval_table(tmp_path / "evals.xlsx")
    for name in ("absent.csv", "absent.parquet", "absent.jsonl"):
        with pytest.raises(EvalsError, match=f"cannot read .*{name}: No such file or directory$"):
            read_eval_table(tmp_path / name)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(EvalsError, match="not a readable Parquet file"):
        read_eval_table(tmp_path / "bad.parquet")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "p"}) + "\n[1, 2]\n")
    with pytest.raises(EvalsError, match=r"evals row 2 \(line 2\): expected a JSON object"):
        read_eval_table(tmp_path / "bad.jsonl")
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    with pytest.raises(EvalsError, match=r"evals row 1 \(line 1\): not valid JSON"):
        read_eval_table(tmp_path / "bad.jsonl")
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "p"}) + "\n\n\n{oops\n")  # blank lines are no rows
    with pytest.raises(EvalsError, match=r"evals row 2 \(line 4\): not valid JSON"):
        read_eval_table(tmp_path / "bad.jsonl")


@pytest.mark.parametrize(("line", "message"), [
    ('{"prompt": "x", "model": "m", "score": 0.5, "output_tokens": ' + "1" * 5000 + "}",
     r"evals row 2 \(line 2\): not valid JSON: Exceeds the limit \(4300 digits\) for integer string conversion"),
    ("[" * 100_000, r"evals row 2 \(line 2\): not valid JSON: it nests arrays or objects too deeply"),
    ('{"prompt": "x", "model": "m", "score": 0.9, "score": 0.1, "output_tokens": 3}',
     r"evals row 2 \(line 2\): the key 'score' is given twice"),
])
def test_a_json_lines_row_json_cannot_take_is_refused_naming_the_row(tmp_path: Path, line: str, message: str) -> None:
    """(Probe: a 5,000-digit integer and 100,000 `[` ended in tracebacks; a key given twice kept its last value.)"""
    first = json.dumps({"prompt": "p", "model": "m", "score": 0.5, "output_tokens": 3})
    (tmp_path / "evals.jsonl").write_text(f"{first}\n{line}\n")
    with pytest.raises(EvalsError, match=message) as error:
        read_eval_table(tmp_path / "evals.jsonl")
    assert "sys.set_int_max_str_digits" not in str(error.value)  # no advice to raise the interpreter's limit


def test_a_csv_with_an_unclosed_quote_is_refused_naming_its_line(tmp_path: Path) -> None:
    """(Probe: it read as one long prompt and then said `row 1: model must be a non-empty string, got None`.)"""
    (tmp_path / "evals.csv").write_text('prompt,model,score,output_tokens\nhi,m,0.5,3\n"x,m,0.5,3\n')
    with pytest.raises(EvalsError, match=r"evals\.csv: the row at line 3 has an unclosed quote"):
        read_eval_table(tmp_path / "evals.csv")
    (tmp_path / "evals.csv").write_text('prompt,model,score,output_tokens\n"x"y,m,0.5,3\n')
    with pytest.raises(EvalsError, match=r"evals\.csv: the row at line 2 is not valid CSV \(',' expected"):
        read_eval_table(tmp_path / "evals.csv")
