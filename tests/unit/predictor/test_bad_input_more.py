"""`bear predictor` on the bad input a probe found: each exits 2 with a message naming the option, row or field, and
prints no traceback and no JSON that is not JSON."""

from __future__ import annotations

import errno
import hashlib
import json
from pathlib import Path

import pytest

from bear.cli import predictor_command
from bear.cli.main import main
from bear.predictor.artifact import MANIFEST, PredictorArtifact
from bear.predictor.evals import write_eval_table
from bear.predictor.predictor import ModelPrediction, Predictor
from tests.predictor_builders import make_table, trained_artifact


def _bad_input(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Runs `bear predictor ARGV`, which must exit 2 printing nothing on stdout; returns stderr."""
    assert main(["predictor", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    return err


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    trained_artifact().save(folder)
    return folder


def test_an_evals_row_json_cannot_decode_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    evals = tmp_path / "evals.jsonl"
    evals.write_text('{"prompt": "x", "model": "Qwen3-8B", "score": 0.5, "output_tokens": ' + "1" * 5000 + "}\n")
    err = _bad_input(["train", "--evals", str(evals), "--out", str(tmp_path / "m")], capsys)
    assert err.startswith("bear predictor train: evals row 1 (line 1): not valid JSON: Exceeds the limit (4300 digits)")


def test_an_artifact_with_an_impossible_scale_to_mean_is_refused(saved: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """(Probe: 1e308, checksum recomputed, printed `"output_tokens": Infinity` with exit 0, and with
    --generated-tokens a traceback.)"""
    distributions = json.loads((saved / "length_distributions.json").read_text())
    distributions["Qwen3-0.6B"]["scale_to_mean"] = 1e308
    text = json.dumps(distributions)
    (saved / "length_distributions.json").write_text(text)
    manifest = json.loads((saved / MANIFEST).read_text())
    manifest["files"]["length_distributions.json"] = hashlib.sha256(text.encode()).hexdigest()
    (saved / MANIFEST).write_text(json.dumps(manifest))
    for extra in ([], ["--generated-tokens", "3"]):
        err = _bad_input(["predict", "--model-dir", str(saved), "--prompt", "hi", *extra], capsys)
        assert "length_distributions.json: model 'Qwen3-0.6B': scale_to_mean must be a number in" in err


def test_a_prediction_that_is_not_finite_is_an_error_not_output(saved: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    def infinite(self: Predictor, prompt: str, models: object = None) -> dict[str, ModelPrediction]:
        return {"Qwen3-8B": ModelPrediction("Qwen3-8B", 0.5, float("inf"), 1, float("inf"))}

    monkeypatch.setattr(Predictor, "predict", infinite)
    for extra in ([], ["--generated-tokens", "3"]):
        err = _bad_input(["predict", "--model-dir", str(saved), "--prompt", "hi", *extra], capsys)
        assert err == f"bear predictor predict: model-dir: {saved} predicts inf output tokens for Qwen3-8B\n"


def test_json_output_never_holds_inf_or_nan(capsys: pytest.CaptureFixture[str]) -> None:
    assert predictor_command._run("evaluate", lambda: {"models": {"m": {"length_mape": float("nan")}}}) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("bear predictor evaluate: a result is not a finite number (")


def test_a_failed_write_names_out_and_the_path_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """(Probe: `train --out /proc/mo` said `/proc/.mo.p8l53zq1: No such file or directory`, the staging folder.)"""
    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".model.p8l53zq1"))

    evals = tmp_path / "evals.csv"
    write_eval_table(make_table(["hi"], ["Qwen3-8B"]), evals)
    monkeypatch.setattr("bear.predictor.training.train", lambda *args: trained_artifact())
    monkeypatch.setattr(PredictorArtifact, "save", disk_full)
    err = _bad_input(["train", "--evals", str(evals), "--out", str(tmp_path / "model")], capsys)
    assert err == f"bear predictor train: --out: cannot write {tmp_path / 'model'}: No space left on device\n"
    monkeypatch.setattr("bear.predictor.evals.write_eval_table", disk_full)
    err = _bad_input(["synth", "--rows", "3", "--seed", "1", "--out", str(tmp_path / "e.csv")], capsys)
    assert err == f"bear predictor synth: --out: cannot write {tmp_path / 'e.csv'}: No space left on device\n"


def test_train_into_a_folder_that_cannot_be_made_is_refused_before_training(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "sub" / "model"
    err = _bad_input(["train", "--evals", str(tmp_path / "absent.csv"), "--out", str(out)], capsys)
    assert err.startswith(f"bear predictor train: --out: {out}: cannot write in {out.parent}: ")
    made = tmp_path / "new" / "sub" / "model"  # missing folders are made for the check, and go when the command fails
    err = _bad_input(["train", "--evals", str(tmp_path / "absent.csv"), "--out", str(made)], capsys)
    assert not (tmp_path / "new").exists() and "absent.csv" in err


@pytest.mark.parametrize("argv", [
    ["train", "--evals", "", "--out", "m"],
    ["train", "--evals", "e.csv", "--out", ""],
    ["train", "--evals", "e.csv", "--catalog", "", "--out", "m"],
    ["evaluate", "--model-dir", "", "--evals", "e.csv"],
    ["evaluate", "--model-dir", "m", "--evals", ""],
    ["predict", "--model-dir", "", "--prompt", "hi"],
    ["predict", "--model-dir", "m", "--prompt-file", ""],
    ["synth", "--rows", "3", "--seed", "1", "--out", ""],
])
def test_an_empty_path_is_refused_naming_the_option(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """(Probe: `--model-dir ""` was read as the current folder, `.: not a predictor artifact`.)"""
    option = argv[argv.index("") - 1]
    with pytest.raises(SystemExit) as exited:
        main(["predictor", *argv])
    assert exited.value.code == 2
    assert f"error: argument {option}: must be a path, got an empty string" in capsys.readouterr().err


def test_a_prompt_file_is_read_no_further_than_the_longest_prompt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """(Probe: `--prompt-file /dev/zero` read until memory ran out.)"""
    monkeypatch.setattr(predictor_command, "MAX_PROMPT_CHARS_LIMIT", 1000)
    err = _bad_input(["predict", "--model-dir", str(tmp_path), "--prompt-file", "/dev/zero"], capsys)
    assert err == "bear predictor predict: prompt-file: /dev/zero holds more than 1000 characters, the most a prompt " \
                  "may have\n"
    (tmp_path / "p.txt").write_text("é" * 1000)
    assert predictor_command._read_prompt(tmp_path / "p.txt") == "é" * 1000
    (tmp_path / "p.txt").write_text("é" * 1001)
    with pytest.raises(ValueError, match="prompt-file: .*p.txt holds more than 1000 characters"):
        predictor_command._read_prompt(tmp_path / "p.txt")


@pytest.mark.parametrize("argv", [
    ["train", "--evals", "e.csv", "--out", " "],
    ["predict", "--model-dir", " \t", "--prompt", "hi"],
    ["evaluate", "--model-dir", "m", "--evals", "  "],
])
def test_a_blank_path_is_refused_naming_the_option(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """(QA: `train --out " "` made a folder named " ", and `predict --model-dir " "` loaded it.)"""
    monkeypatch.chdir(tmp_path)
    blank = next(a for a in argv if a and not a.strip())
    option = argv[argv.index(blank) - 1]
    with pytest.raises(SystemExit) as exited:
        main(["predictor", *argv])
    assert exited.value.code == 2
    assert f"error: argument {option}: must be a path, got only white space" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_prompt_that_is_not_utf8_is_refused_as_from_a_file(saved: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """(QA: `--prompt $'\\xff\\xfe'` was taken, as lone surrogates, where `--prompt-file` refused the same bytes.)"""
    undecodable = b"\xff\xfe".decode("utf-8", "surrogateescape")  # how Python passes those bytes of argv on
    with pytest.raises(SystemExit) as exited:
        main(["predictor", "predict", "--model-dir", str(saved), "--prompt", undecodable])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "error: argument --prompt: not UTF-8 text" in err
    (tmp_path / "prompt.txt").write_bytes(b"\xff\xfe")
    err = _bad_input(["predict", "--model-dir", str(saved), "--prompt-file", str(tmp_path / "prompt.txt")], capsys)
    assert "prompt-file: cannot read" in err


@pytest.mark.parametrize("argv", [
    ["synth", "--rows", "3", "--seed", "1", "--out", "{folder}"],
    ["train", "--evals", "{folder}", "--out", "{folder}/model"],
    ["train", "--evals", "{folder}/evals.txt", "--out", "{folder}/model"],
])
def test_a_path_of_no_table_format_is_named_whole(argv: list[str], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """(QA: `synth --out /tmp` and `train --evals /tmp` said "tmp: unknown format", the last part of the path only.)"""
    folder = tmp_path / "tables"
    folder.mkdir()
    err = _bad_input([a.format(folder=folder) for a in argv], capsys)
    named = argv[-3].format(folder=folder) if argv[0] == "train" else str(folder)
    assert f": {named}" in err and (" unknown format" in err or "is a folder, not a file" in err), err
