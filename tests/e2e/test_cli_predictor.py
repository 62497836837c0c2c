"""`bear predictor` as a user runs it: synth → train → evaluate → predict, one JSON object each; bad input exits 2
with a message naming the field, column or file."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

BEAR = shutil.which("bear") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "bear")


def _bear(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BEAR, "predictor", *args], capture_output=True, text=True, timeout=120)


def _json(completed: subprocess.CompletedProcess[str]) -> dict:
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic training table, a held-out one and a model trained on the first."""
    folder = tmp_path_factory.mktemp("predictor")
    _json(_bear("synth", "--rows", "450", "--seed", "1", "--out", str(folder / "train.parquet")))
    _json(_bear("synth", "--rows", "150", "--seed", "2", "--out", str(folder / "test.csv")))
    _json(_bear("train", "--evals", str(folder / "train.parquet"), "--out", str(folder / "model"), "--num-trees",
                "30"))
    return folder


def test_synth_writes_a_table_labelled_synthetic(tmp_path: Path) -> None:
    printed = _json(_bear("synth", "--rows", "20", "--seed", "3", "--out", str(tmp_path / "evals.jsonl")))
    assert printed["synthetic"] is True and printed["source"].startswith("bear-synthetic")
    assert printed["rows"] == 20 and printed["prompts"] == 7
    assert set(printed["table2_mean_score"]) == {"instruction", "multidoc_qa", "long_summarization",
                                                 "creative_writing"}
    lines = (tmp_path / "evals.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert len(lines) == 20 and first["source"] == printed["source"]
    assert set(first) == {"prompt", "model", "score", "output_tokens", "task", "source"}


def test_synth_of_a_few_rows_warns_nothing_and_a_bad_out_is_refused_before_the_work(tmp_path: Path) -> None:
    tiny = _bear("synth", "--rows", "4", "--seed", "1", "--out", str(tmp_path / "tiny.parquet"))
    assert _json(tiny)["rows"] == 4 and "Warning" not in tiny.stderr  # not a prompt of every task
    refused = _bear("synth", "--rows", "200000", "--seed", "1", "--out", str(tmp_path / "evals.txt"))
    assert refused.returncode == 2 and f"--out: {tmp_path / 'evals.txt'}: unknown format" in refused.stderr
    assert not (tmp_path / "evals.txt").exists()
    refused = _bear("synth", "--rows", "200000", "--seed", "1", "--out", str(tmp_path / "missing" / "evals.parquet"))
    assert refused.returncode == 2 and "the folder" in refused.stderr and "does not exist" in refused.stderr


def test_synth_does_not_replace_an_existing_table_without_force(tmp_path: Path) -> None:
    """(QA: it silently replaced a user's real evaluations with the synthetic table.)"""
    real = tmp_path / "my_real_evals.csv"
    real.write_text("prompt,model,score,output_tokens\nmine,Qwen3-8B,1,10\n")
    refused = _bear("synth", "--rows", "3", "--seed", "0", "--out", str(real))
    assert refused.returncode == 2 and "exists (use --force to replace it" in refused.stderr
    assert "mine" in real.read_text()
    assert _json(_bear("synth", "--rows", "3", "--seed", "0", "--out", str(real), "--force"))["rows"] == 3
    (tmp_path / "d.parquet").mkdir()
    refused = _bear("synth", "--rows", "3", "--seed", "0", "--out", str(tmp_path / "d.parquet"), "--force")
    assert refused.returncode == 2 and "is a folder, not a file" in refused.stderr


def test_train_writes_a_model_directory(workspace: Path) -> None:
    manifest = json.loads((workspace / "model" / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["training"]["num_rows"] == 450


def test_evaluate_prints_metrics_and_the_constant_baseline(workspace: Path) -> None:
    printed = _json(_bear("evaluate", "--model-dir", str(workspace / "model"), "--evals", str(workspace / "test.csv")))
    assert set(printed) == {"models", "constant_baseline"}
    assert list(printed["models"]) == ["Qwen3-0.6B", "Qwen3-8B", "Qwen3-32B"]
    for section in printed.values():
        for metrics in section.values():
            assert set(metrics) == {"accuracy_mae", "accuracy_spearman", "length_mape"}


def test_predict_prints_accuracy_tokens_and_cost_per_model(workspace: Path) -> None:
    printed = _json(_bear("predict", "--model-dir", str(workspace / "model"), "--prompt",
                          "List five tips for sleeping well.", "--generated-tokens", "40", "--max-tokens", "512"))
    assert list(printed) == ["models"] and list(printed["models"]) == ["Qwen3-0.6B", "Qwen3-8B", "Qwen3-32B"]
    small = printed["models"]["Qwen3-0.6B"]
    assert set(small) == {"accuracy", "output_tokens", "prompt_tokens", "cost_usd", "expected_remaining_tokens"}
    assert small["prompt_tokens"] == 7 and 0 <= small["accuracy"] <= 1
    assert small["cost_usd"] == pytest.approx((7 * 0.044 + small["output_tokens"] * 0.173) / 1e6, rel=1e-3)
    assert 1 <= small["expected_remaining_tokens"] <= 512 - 40
    only = _json(_bear("predict", "--model-dir", str(workspace / "model"), "--prompt", "Hi", "--models", "Qwen3-8B"))
    assert list(only["models"]) == ["Qwen3-8B"] and "expected_remaining_tokens" not in only["models"]["Qwen3-8B"]


def test_a_catalogue_replaces_the_papers_pool(workspace: Path, tmp_path: Path) -> None:
    catalog = tmp_path / "models.yaml"
    catalog.write_text("models:\n" + "".join(
        f"  - {{name: {name}, input_usd_per_mtok: 1.0, output_usd_per_mtok: 2.0, num_params: {params}, "
        f"max_context_tokens: 32768}}\n" for name, params in (("Qwen3-0.6B", "6.0e+8"), ("Qwen3-8B", "8.0e+9"),
                                                              ("Qwen3-32B", "3.2e+10"))))
    _json(_bear("train", "--evals", str(workspace / "train.parquet"), "--catalog", str(catalog), "--out",
                str(tmp_path / "model"), "--num-trees", "5"))
    printed = _json(_bear("predict", "--model-dir", str(tmp_path / "model"), "--prompt", "Hello there."))
    for p in printed["models"].values():
        assert p["cost_usd"] == pytest.approx((p["prompt_tokens"] * 1.0 + p["output_tokens"] * 2.0) / 1e6, rel=1e-3)


def _bad(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("args", "message"), [
    (lambda w, t: ["train", "--evals", _bad(t, "e.csv", "prompt,model,output_tokens\nhi,Qwen3-8B,3\n"), "--out",
                   str(t / "m")], "missing column 'score'"),
    (lambda w, t: ["train", "--evals", _bad(t, "e.jsonl", json.dumps({"prompt": "hi", "model": "Qwen3-8B",
                                                                      "score": float("nan"), "output_tokens": 3})),
                   "--out", str(t / "m")], "evals row 1: score is NaN"),
    (lambda w, t: ["train", "--evals", str(w / "train.parquet"), "--out", str(w / "model")],
     r"out: .* exists and is not an empty directory \(use --force to replace it\)"),
    (lambda w, t: ["train", "--evals", str(w / "train.parquet"), "--out", str(w), "--force"],
     "out: .* holds files but no predictor artifact"),  # the working folder is never wiped
    (lambda w, t: ["train", "--evals", str(w / "train.parquet"), "--catalog", _bad(t, "c.yaml", "models: [{}]"),
                   "--out", str(t / "m")], r"models\[0\]\.name: missing"),
    (lambda w, t: ["predict", "--model-dir", str(w / "model"), "--prompt", "  "], "prompt is empty"),
    (lambda w, t: ["predict", "--model-dir", str(w / "model"), "--prompt", "hi", "--models", "gpt-5"],
     "unknown model 'gpt-5'"),
    (lambda w, t: ["predict", "--model-dir", str(w / "model"), "--prompt", "hi", "--models", " , "],
     "models: no model name in ' , '"),
    (lambda w, t: ["predict", "--model-dir", str(t), "--prompt", "hi"], "not a predictor artifact"),
    (lambda w, t: ["predict", "--model-dir", str(t / "absent"), "--prompt", "hi"], "absent: no such folder"),
    (lambda w, t: ["predict", "--model-dir", str(w / "model"), "--prompt", "hi", "--generated-tokens", "9",
                   "--max-tokens", "9"], "max-tokens: must exceed --generated-tokens"),
    (lambda w, t: ["evaluate", "--model-dir", str(w / "model"), "--evals",
                   _bad(t, "e.csv", "prompt,model,score,output_tokens\nhi,Llama,0.5,3\n")],
     "evals row 1: model 'Llama' is not in the catalogue"),
    (lambda w, t: ["synth", "--rows", "10", "--seed", "-1", "--out", str(t / "e.csv")], "argument --seed: "),
    (lambda w, t: ["synth", "--rows", "1000000000000", "--seed", "1", "--out", str(t / "e.csv")],
     "argument --rows: must be at most 200000"),
    (lambda w, t: ["train", "--evals", str(w / "train.parquet"), "--seed", "-1", "--out", str(t / "m")],
     "argument --seed: "),
    (lambda w, t: ["train", "--evals", str(w / "train.parquet"), "--seed", str(2**31), "--out", str(t / "m")],
     "argument --seed: "),
    (lambda w, t: ["predict", "--model-dir", str(w / "model"), "--prompt", "hi", "--generated-tokens",
                   "99999999999999999999"], "argument --generated-tokens: "),
    (lambda w, t: ["predict", "--model-dir", str(w / "model"), "--prompt", "hi", "--generated-tokens", "9",
                   "--max-tokens", "99999999999999999999"], "argument --max-tokens: "),
])
def test_bad_input_exits_2_naming_the_problem(workspace: Path, tmp_path: Path, args, message: str) -> None:
    completed = _bear(*args(workspace, tmp_path))
    assert completed.returncode == 2, completed.stdout
    assert completed.stdout == ""
    assert completed.stderr.startswith(("bear predictor ", "usage: bear predictor "))  # ours, or argparse's
    assert "Traceback" not in completed.stderr
    import re
    assert re.search(message, completed.stderr), completed.stderr



def test_ctrl_c_ends_a_command_with_status_130_and_no_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from bear.cli.main import main
    from bear.predictor import synthetic_corpus

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # Ctrl-C while the table is built

    monkeypatch.setattr(synthetic_corpus, "generate", interrupted)
    assert main(["predictor", "synth", "--rows", "10", "--seed", "1", "--out", str(tmp_path / "e.parquet")]) == 130
    assert capsys.readouterr().err == "bear predictor: interrupted\n"
