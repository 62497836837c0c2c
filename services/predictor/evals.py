"""The evaluation table an operator trains the predictor from: one row per (prompt, model) that was run and judged.

Columns: prompt (text), model (a catalogue name), score (the judge's score normalised to [0, 1], Appendix C),
output_tokens (the response's length, an integer >= 1), and optionally task (a label kept for reports, empty where
missing; never a feature, since a prompt arriving at the router has none). Other columns are ignored. Formats, by
file extension: Parquet (.parquet, .pq), CSV (.csv, with a header) and JSON Lines (.jsonl, .ndjson; a key given twice
in a row is refused). An EvalsError names the column, and the row (counted from 1) where one is at fault.
"""

from __future__ import annotations

import contextlib
import csv
import decimal
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bear.common import strict_json
from bear.common.messages import shown

REQUIRED_COLUMNS = ("prompt", "model", "score", "output_tokens")
OPTIONAL_COLUMNS = ("task",)
MAX_OUTPUT_TOKENS = 10**9  # a response longer than this is a broken row (and would not fit the int64 column)
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


class EvalsError(ValueError):
    """An evaluation table that cannot be used; the message names the column (and row)."""


@dataclass(frozen=True, slots=True, eq=False)
class EvalTable:
    prompts: tuple[str, ...]
    models: tuple[str, ...]
    scores: np.ndarray  # float64 in [0, 1]
    output_tokens: np.ndarray  # int64 >= 1
    tasks: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    def rows_of(self, model: str) -> np.ndarray:
        """Indices of the model's rows."""
        return np.flatnonzero(np.asarray(self.models, dtype=object) == model)


def read_eval_table(path: Path) -> EvalTable:
    columns, from_text = _read_columns(path)
    return table_from_columns(columns, from_text=from_text)


def write_eval_table(table: EvalTable, path: Path, extra_columns: Mapping[str, Sequence[Any]] | None = None) -> None:
    """Writes `table` (and `extra_columns`, one value per row) in the format of `path`'s extension."""
    columns: dict[str, list[Any]] = {
        "prompt": list(table.prompts), "model": list(table.models), "score": table.scores.tolist(),
        "output_tokens": table.output_tokens.tolist(),
    }
    if table.tasks is not None:
        columns["task"] = list(table.tasks)
    columns.update({name: list(values) for name, values in (extra_columns or {}).items()})
    kind = _format(path)
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table(columns), path)
    elif kind == "csv":
        with path.open("w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow(columns)
            writer.writerows(zip(*columns.values(), strict=True))
    else:
        with path.open("w", encoding="utf-8") as out:
            for i in range(len(table)):
                out.write(json.dumps({name: values[i] for name, values in columns.items()}) + "\n")


def table_from_columns(columns: Mapping[str, Sequence[Any]], *, from_text: bool = False) -> EvalTable:
    """Checks and converts decoded columns (`from_text`: CSV, where every value is a string)."""
    for name in REQUIRED_COLUMNS:
        if name not in columns:
            raise EvalsError(f"evals: missing column {name!r} (need {', '.join(REQUIRED_COLUMNS)})")
    num_rows = len(columns["prompt"])
    if num_rows == 0:
        raise EvalsError("evals: the table has no rows")
    prompts = tuple(_text(v, "prompt", i) for i, v in enumerate(columns["prompt"]))
    models = tuple(_text(v, "model", i) for i, v in enumerate(columns["model"]))
    scores = np.array([_score(v, i, from_text) for i, v in enumerate(columns["score"])], dtype=np.float64)
    tokens = np.array([_tokens(v, i, from_text) for i, v in enumerate(columns["output_tokens"])], dtype=np.int64)
    tasks = None
    if "task" in columns:
        tasks = tuple(_task(v, i) for i, v in enumerate(columns["task"]))
    if not (len(models) == len(scores) == len(tokens) == num_rows):
        raise EvalsError("evals: columns have different lengths")
    return EvalTable(prompts, models, scores, tokens, tasks)


def _read_columns(path: Path) -> tuple[dict[str, list[Any]], bool]:
    kind = _format(path)
    try:
        if kind == "parquet":
            return _parquet_columns(path), False
        if kind == "csv":
            # utf-8-sig: spreadsheets start their CSV with a byte-order mark, which would stick to the first name
            with path.open(newline="", encoding="utf-8-sig") as source, _csv_fields_of_any_size():
                reader = csv.reader(source, strict=True)  # strict: an unclosed quote is an error, not a long field
                rows = _csv_rows(reader, path)
                header = next(rows, [])
                repeated = sorted({name for name in header if header.count(name) > 1})
                if repeated:  # which of the two would be meant? (Parquet refuses it too)
                    raise EvalsError(f"evals: {path}: column {shown(repeated[0])} appears more than once in the header")
                columns: dict[str, list[Any]] = {name: [] for name in header}
                for row in rows:
                    if not row:  # a blank line (DictReader skipped them too)
                        continue
                    if len(row) > len(header):  # a stray comma: the fields no longer line up with the header
                        raise EvalsError(f"evals: {path}: line {reader.line_num} has {len(row)} fields, the header "
                                         f"{len(header)}")
                    for name, value in zip(header, row):
                        columns[name].append(value)
                    for name in header[len(row):]:  # a short row: its missing fields are empty, as DictReader had it
                        columns[name].append(None)
            return columns, True
        return _jsonl_columns(path), False
    except OSError as error:  # Arrow's FileNotFoundError carries only the path: say what happened instead
        reason = error.strerror or ("No such file or directory" if isinstance(error, FileNotFoundError) else error)
        raise EvalsError(f"evals: cannot read {path}: {reason}") from None
    except (UnicodeDecodeError, csv.Error) as error:
        raise EvalsError(f"evals: {path} is not a readable {kind} file: {error}") from None
    except MemoryError:  # a table larger than this machine's memory, or no end to it (/dev/zero)
        raise EvalsError(f"evals: {path} is too large to read into this machine's memory") from None


def _csv_rows(reader: Any, path: Path) -> Iterator[list[str]]:
    """The reader's rows; a malformed one is an EvalsError naming the line where it starts."""
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            problem = "has an unclosed quote" if "end of data" in str(error) else "is not valid CSV"
            raise EvalsError(f"evals: {path}: the row at line {start} {problem} ({error})") from None
        yield row


@contextlib.contextmanager
def _csv_fields_of_any_size() -> Iterator[None]:
    """csv refuses fields over 128 KiB by default; a long-document prompt is larger."""
    previous = csv.field_size_limit(2**31 - 1)
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def _parquet_columns(path: Path) -> dict[str, list[Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pydict()
    except pa.ArrowException as error:
        raise EvalsError(f"evals: {path} is not a readable Parquet file: {error}") from None


def _jsonl_columns(path: Path) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {}
    # Lines end at "\n" only: splitlines() would also cut at U+2028, U+2029 and U+0085, which JSON strings may hold raw.
    lines = [(number, line) for number, line in enumerate(path.read_text(encoding="utf-8-sig").split("\n"), 1)
             if line.strip()]
    for i, (number, line) in enumerate(lines):
        try:
            record = strict_json.loads(line)
        except strict_json.JsonError as error:
            raise EvalsError(f"evals row {i + 1} (line {number}): {error}") from None
        if not isinstance(record, dict):
            raise EvalsError(f"evals row {i + 1} (line {number}): expected a JSON object")
        for name in {*columns, *record}:
            columns.setdefault(name, [None] * i).append(record.get(name))
    return columns


def _format(path: Path, what: str = "evals") -> str:
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise EvalsError(f"{what}: {path}: unknown format; use one of {', '.join(FORMATS)}")
    return kind


def check_table_path(path: Path, what: str) -> None:
    """Raises EvalsError (naming `what`, e.g. the option) unless a table can be written at `path`: an extension of
    a table format, in a folder that exists."""
    _format(path, what)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise EvalsError(f"{what}: {path}: the folder {folder} does not exist")


def _text(value: Any, column: str, i: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise EvalsError(f"evals row {i + 1}: {column} must be a non-empty string, got {shown(value)}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate (JSON's "\ud800"): no engine could be sent it
            raise EvalsError(f"evals row {i + 1}: {column} is not valid Unicode text ({error.reason} at character "
                             f"{error.start})") from None
    return value


def _task(value: Any, i: int) -> str:
    """The optional label: missing (None, NaN, empty) is ""."""
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return ""
    if not isinstance(value, str):
        raise EvalsError(f"evals row {i + 1}: task must be a string, got {shown(value)}")
    return value


def _score(value: Any, i: int, from_text: bool) -> float:
    number = _number(value, "score", i, from_text)
    if math.isnan(number):
        raise EvalsError(f"evals row {i + 1}: score is NaN")
    if not 0.0 <= number <= 1.0:
        raise EvalsError(f"evals row {i + 1}: score {number!r} is outside [0, 1] (normalise judge scores to [0, 1])")
    return number


def _tokens(value: Any, i: int, from_text: bool) -> int:
    number = _number(value, "output_tokens", i, from_text)
    if not (math.isfinite(number) and number == int(number) and 1 <= number <= MAX_OUTPUT_TOKENS):
        raise EvalsError(f"evals row {i + 1}: output_tokens must be an integer in [1, {MAX_OUTPUT_TOKENS}], "
                         f"got {shown(value)}")
    return int(number)


def _number(value: Any, column: str, i: int, from_text: bool) -> float:
    if from_text and isinstance(value, str):
        try:
            if "_" in value:  # Python's float() reads 1_000; a table's number does not hold one
                raise ValueError(value)
            return float(value)
        except ValueError:
            raise EvalsError(f"evals row {i + 1}: {column} must be a number, got {shown(value)}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float, decimal.Decimal)):  # Decimal: SQL exports
        raise EvalsError(f"evals row {i + 1}: {column} must be a number, got {shown(value)}")
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float (JSON Lines allows it)
        raise EvalsError(f"evals row {i + 1}: {column} must be a number of a sensible size, got {shown(value)}") \
            from None
    except ValueError:  # a signalling NaN Decimal
        raise EvalsError(f"evals row {i + 1}: {column} must be a number, got {shown(value)}") from None
