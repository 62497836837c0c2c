"""The artifact: train → save → load predicts identically; a corrupt, foreign or mismatched directory is refused
with a message naming the file."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from bear.predictor.artifact import FORMAT_VERSION, MANIFEST, ArtifactError, PredictorArtifact
from bear.predictor.predictor import Predictor, load_predictor
from tests.predictor_builders import PROMPTS, trained_artifact


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    trained_artifact().save(folder)
    return folder


def _rewrite(folder: Path, name: str, text: str, *, fix_checksum: bool) -> None:
    (folder / name).write_text(text)
    if fix_checksum:
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["files"][name] = hashlib.sha256(text.encode()).hexdigest()
        (folder / MANIFEST).write_text(json.dumps(manifest))


def test_a_loaded_predictor_predicts_exactly_what_the_trained_one_did(saved: Path) -> None:
    trained, loaded = Predictor(trained_artifact()), load_predictor(str(saved))  # a path as text works too
    for prompt in PROMPTS:
        assert loaded.predict(prompt) == trained.predict(prompt)
    assert loaded.catalog == trained.catalog
    for model in loaded.catalog.names:
        assert np.array_equal(loaded.artifact.length_distributions[model].ratios,
                              trained.artifact.length_distributions[model].ratios)
        assert loaded.expected_remaining_tokens(model, 300.0, 250, 1000) == \
            trained.expected_remaining_tokens(model, 300.0, 250, 1000)
    assert loaded.artifact.training["num_rows"] == trained.artifact.training["num_rows"]


def test_saving_never_overwrites_unless_asked(saved: Path) -> None:
    with pytest.raises(FileExistsError):
        trained_artifact().save(saved)
    trained_artifact().save(saved, replace=True)
    assert PredictorArtifact.load(saved).catalog.names == trained_artifact().catalog.names
    assert sorted(p.name for p in saved.parent.iterdir()) == ["model"]  # no staging directory left behind


def test_the_current_folder_is_saved_into_and_replaced(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # QA: "--out ." staged the artifact inside the folder itself, then failed to rename; with --force it first
    # deleted the earlier artifact
    monkeypatch.chdir(saved)
    before = PredictorArtifact.load(".").training
    (saved / "baselines.json").write_text("{}")  # damaged: replaced whole
    trained_artifact().save(".", replace=True)
    assert PredictorArtifact.load(saved).training == before
    assert Path(os.getcwd()).samefile(saved)  # the folder itself, not a copy put in its place
    assert sorted(p.name for p in saved.parent.iterdir()) == ["model"]  # nothing left aside
    assert not [p for p in saved.iterdir() if p.name.startswith(".")]


def test_a_folder_that_cannot_be_renamed_has_its_files_replaced_in_place(saved: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # a mount point (a volume's root) or a folder whose parent this process cannot write: as root, neither can be
    # made here, so the test takes the in-place path as those take it
    import bear.predictor.artifact as artifact_module

    monkeypatch.setattr(artifact_module, "_written_in_place", lambda folder: True)
    (saved / "baselines.json").write_text("{}")  # damaged: replaced whole
    trained_artifact().save(saved, replace=True)
    assert load_predictor(saved).predict(PROMPTS[0]) == Predictor(trained_artifact()).predict(PROMPTS[0])
    assert sorted(p.name for p in saved.iterdir()) == sorted(os.listdir(saved)) and not any(
        name.startswith(".") for name in os.listdir(saved))


def test_an_earlier_artifact_stays_when_the_new_one_cannot_be_put_in_place(saved: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    original_rename = Path.rename

    def rename(self: Path, target: Path) -> Path:
        if self.name.startswith(".model.") and not self.name.startswith(".model.old.") and Path(target) == saved:
            raise OSError(16, "Device or resource busy")
        return original_rename(self, target)

    before = (saved / MANIFEST).read_text()
    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError, match="busy"):
        trained_artifact().save(saved, replace=True)
    assert (saved / MANIFEST).read_text() == before and PredictorArtifact.load(saved) is not None
    assert sorted(p.name for p in saved.parent.iterdir()) == ["model"]


def test_replacing_takes_an_earlier_artifact_but_never_a_folder_holding_anything_else(saved: Path,
                                                                                      tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="no predictor artifact"):
        trained_artifact().save(mine, replace=True)
    assert (mine / "notes.txt").read_text() == "keep" and (mine / "sub").is_dir()
    (saved / "notes.txt").write_text("keep")  # an artifact with a file of the user's beside it
    with pytest.raises(FileExistsError, match=r"holds more than a predictor artifact \(notes.txt\)"):
        trained_artifact().save(saved, replace=True)
    assert (saved / "notes.txt").exists()


def test_a_directory_without_a_manifest(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="not a predictor artifact"):
        load_predictor(tmp_path)


def test_a_corrupt_file_is_named(saved: Path) -> None:
    text = (saved / "accuracy.lgbm.txt").read_text()
    (saved / "accuracy.lgbm.txt").write_text(text.replace("Tree=1", "Tree=7", 1))
    with pytest.raises(ArtifactError, match=r"accuracy.lgbm.txt: corrupt \(its SHA-256 differs"):
        load_predictor(saved)


def test_a_missing_file_is_named(saved: Path) -> None:
    (saved / "baselines.json").unlink()
    with pytest.raises(ArtifactError, match="baselines.json: missing or unreadable"):
        load_predictor(saved)


@pytest.mark.parametrize("text, reason", [("[" * 100_000 + "]" * 100_000, "it nests arrays or objects too deeply"),
                                          ('{"format": ' + "9" * 5000 + "}", "Exceeds the limit")])
def test_a_manifest_json_cannot_take_is_named(saved: Path, text: str, reason: str) -> None:
    """(QA: a RecursionError or ValueError traceback; the manifest is the one file no checksum covers.)"""
    (saved / MANIFEST).write_text(text)
    with pytest.raises(ArtifactError, match=f"{MANIFEST}: unreadable \\(not valid JSON: {reason}"):
        load_predictor(saved)


def test_another_format_version_is_refused(saved: Path) -> None:
    manifest = json.loads((saved / MANIFEST).read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    (saved / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=f"format_version {FORMAT_VERSION + 1}, this version of BEAR reads "
                                            f"{FORMAT_VERSION}"):
        load_predictor(saved)


def test_models_trained_on_other_features_are_refused(saved: Path) -> None:
    spec = json.loads((saved / "features.json").read_text())
    spec["instruction_window_chars"] = 500
    _rewrite(saved, "features.json", json.dumps(spec), fix_checksum=True)
    with pytest.raises(ArtifactError, match=r"other features .*differing: instruction_window_chars"):
        load_predictor(saved)


def test_a_consistent_but_unusable_model_is_refused(saved: Path) -> None:
    _rewrite(saved, "log_output_tokens.lgbm.txt", "tree\nnot a model\n", fix_checksum=True)
    with pytest.raises(ArtifactError, match="LightGBM cannot use the stored models"):
        load_predictor(saved)
    _rewrite(saved, "length_distributions.json", json.dumps({"Qwen3-0.6B": {"ratios": [1.0]}}), fix_checksum=True)
    with pytest.raises(ArtifactError, match="length_distributions.json: model 'Qwen3-0.6B'"):
        load_predictor(saved)


@pytest.mark.parametrize("entry", [{"accuracy": float("nan"), "output_tokens": 10},
                                   {"accuracy": 1.5, "output_tokens": 10},
                                   {"accuracy": 0.5, "output_tokens": float("inf")}])
def test_a_baseline_that_is_no_accuracy_or_length_is_refused(saved: Path, entry: dict[str, float]) -> None:
    """(QA: a baselines.json holding NaN loaded, and `bear predictor evaluate` printed NaN, which is no JSON.)"""
    baselines = json.loads((saved / "baselines.json").read_text())
    baselines["Qwen3-0.6B"] = entry
    _rewrite(saved, "baselines.json", json.dumps(baselines), fix_checksum=True)
    with pytest.raises(ArtifactError, match="baselines.json: model 'Qwen3-0.6B': accuracy must be in"):
        load_predictor(saved)


def test_the_artifact_folder_is_as_readable_as_its_files(tmp_path: Path) -> None:
    """(QA: mkdtemp's 0700 stayed on the folder, so a service under another account could not read a model whose
    files it could.)"""
    previous = os.umask(0o022)
    try:
        trained_artifact().save(tmp_path / "model")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "model" / MANIFEST).stat().st_mode) == 0o644


def test_a_symbolic_link_is_no_place_to_save(saved: Path, tmp_path: Path) -> None:
    """(QA: `train --out link --force` failed with ': Cannot call rmtree on a symbolic link'.)"""
    (tmp_path / "link").symlink_to(saved)
    with pytest.raises(FileExistsError, match="is a symbolic link: give the folder it points to"):
        trained_artifact().save(tmp_path / "link", replace=True)
    assert (saved / MANIFEST).exists()
