"""A trained predictor on disk: one directory, every file listed with its SHA-256 in the manifest.

    manifest.json              format, format_version, files {name: sha256}, training summary
    catalog.json               the models with prices (USD per million tokens), parameter counts, contexts, tokenizers
    features.json              the feature definition (bear.predictor.features.feature_spec) the models were trained on
    projections.json           per tokenizer, the hashing projection (mean, components)
    accuracy.lgbm.txt          LightGBM text model: judge score
    log_output_tokens.lgbm.txt LightGBM text model: log output tokens (the length scale)
    length_distributions.json  per model, the ratio table of real to predicted length and the scale-to-mean factor
    baselines.json             per model, the constant predictor's values (for `evaluate`)

Loading checks, in order: the manifest, the format and its version, every file's presence and checksum, the feature
definition against this code's, then each file's content. Any failure is an ArtifactError saying which file and why.
JSON floats round-trip exactly, so a loaded artifact predicts exactly what the trained one did.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bear.common import strict_json
from bear.predictor.catalog import Catalog, CatalogError, parse_catalog
from bear.predictor.evaluation import ConstantBaseline
from bear.predictor.features import HASH_DIMENSIONS, PROJECTION_DIMENSIONS, feature_spec
from bear.predictor.length_distribution import LengthDistribution
from bear.predictor.projection import Projection
from bear.predictor.tokenizers import KNOWN_TOKENIZERS

FORMAT = "bear-predictor"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ACCURACY_MODEL = "accuracy.lgbm.txt"
LOG_OUTPUT_TOKENS_MODEL = "log_output_tokens.lgbm.txt"
FILES = ("catalog.json", "features.json", "projections.json", ACCURACY_MODEL, LOG_OUTPUT_TOKENS_MODEL,
         "length_distributions.json", "baselines.json")  # besides the manifest
T = TypeVar("T")


class ArtifactError(ValueError):
    """A directory that is not a loadable predictor artifact; the message names the file and the problem."""


def write_problem(folder: Path) -> str | None:
    """Why `PredictorArtifact.save` could not write at `folder` (for a check before a long training), or None: it
    writes in the folder's parent, or in the folder itself where that is a mount point or the parent is not
    writable. Makes the missing folders above it."""
    folder = Path(os.path.abspath(folder))
    where = folder if _written_in_place(folder) else folder.parent
    try:
        where.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".bear-write-check.", dir=where))
    except OSError as error:
        return f"cannot write in {where}: {error.strerror or error}"
    return None


def _written_in_place(folder: Path) -> bool:
    """Whether `save` replaces the files in `folder` rather than the folder: one that cannot be renamed, or the
    current folder or one above it (a shell in it would be left in the old, deleted one)."""
    if not folder.is_dir():
        return False
    cwd = Path(os.getcwd())
    return (os.path.ismount(folder) or not os.access(folder.parent, os.W_OK | os.X_OK) or folder == cwd
            or folder in cwd.parents)


def _replace_files(folder: Path, files: Mapping[str, str]) -> None:
    """Writes `files` (the manifest last) into `folder` one by one, each whole before it replaces the old one."""
    (folder / MANIFEST).unlink(missing_ok=True)
    for name, text in sorted(files.items(), key=lambda item: item[0] == MANIFEST):
        partial = folder / f".{name}.partial"
        try:
            partial.write_text(text, encoding="utf-8")
            os.replace(partial, folder / name)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise


def save_problem(folder: Path, replace: bool) -> str | None:
    """Why an artifact cannot be saved into `folder`, or None: it may be absent or an empty directory, and with
    `replace` an earlier artifact (its manifest and files, nothing else), never a folder holding anything more."""
    if folder.is_symlink():  # replacing it would replace the link, not what it points to
        return f"{folder} is a symbolic link: give the folder it points to ({folder.resolve()})"
    if not folder.exists():
        return None
    if not folder.is_dir():
        return f"{folder} exists and is not a directory"
    entries = {entry.name for entry in folder.iterdir()}
    if not entries:
        return None
    if not replace:
        return f"{folder} exists and is not an empty directory"
    if MANIFEST not in entries:
        return f"{folder} holds files but no predictor artifact ({MANIFEST}): only an artifact is replaced"
    others = sorted(entries - {MANIFEST, *FILES})
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        return f"{folder} holds more than a predictor artifact ({shown}): only an artifact is replaced"
    return None


@dataclass(frozen=True, eq=False)
class PredictorArtifact:
    catalog: Catalog
    projections: Mapping[str, Projection]  # by tokenizer name
    accuracy_model: str  # LightGBM text
    log_output_tokens_model: str  # LightGBM text
    length_distributions: Mapping[str, LengthDistribution]  # by model name
    baselines: Mapping[str, ConstantBaseline]  # by model name
    training: Mapping[str, Any]  # summary of the training run

    def save(self, folder: Path | str, *, replace: bool = False) -> None:
        """Writes the artifact into `folder` (see `save_problem` for the folders it takes): written whole in a
        sibling, then renamed into place, an earlier artifact moved aside until then; where the folder cannot be
        renamed (a mount point, a parent this process cannot write) or is the current one, its files are replaced one
        by one, the manifest last (removed first, so that a folder left half-written is no artifact)."""
        folder = Path(os.path.abspath(folder))  # "." is the folder itself, and its parent the real one
        problem = save_problem(folder, replace)
        if problem is not None:
            raise FileExistsError(problem)
        files = {
            "catalog.json": _json(self.catalog.to_json()),
            "features.json": _json(feature_spec()),
            "projections.json": _json({name: {"mean": p.mean.tolist(), "components": p.components.tolist()}
                                       for name, p in self.projections.items()}),
            ACCURACY_MODEL: self.accuracy_model,
            LOG_OUTPUT_TOKENS_MODEL: self.log_output_tokens_model,
            "length_distributions.json": _json({name: {"scale_to_mean": d.scale_to_mean,
                                                       "tail_points": d.tail_points, "ratios": d.ratios.tolist()}
                                                for name, d in self.length_distributions.items()}),
            "baselines.json": _json({name: {"accuracy": b.accuracy, "output_tokens": b.output_tokens}
                                     for name, b in self.baselines.items()}),
        }
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                    "files": {name: _sha256(text) for name, text in files.items()}, "training": self.training}
        files[MANIFEST] = _json(manifest)
        if _written_in_place(folder):
            _replace_files(folder, files)
            return
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            # mkdtemp makes it private (0700); the artifact is read by services under other accounts, as its files
            # (made under the umask) are.
            staging.chmod(0o777 & ~_umask())
            for name, text in files.items():
                (staging / name).write_text(text, encoding="utf-8")
            if not folder.exists():
                staging.rename(folder)
                return
            aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", dir=folder.parent))
            folder.rename(aside)  # onto the empty folder mkdtemp made
            try:
                staging.rename(folder)
            except BaseException:
                aside.rename(folder)
                raise
            shutil.rmtree(aside, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    @staticmethod
    def load(folder: Path | str) -> PredictorArtifact:
        folder = Path(folder)
        texts, manifest = _verified_files(folder)
        stored_spec, current_spec = _decode(texts, folder, "features.json"), feature_spec()
        if stored_spec != current_spec:
            differing = sorted(k for k in {*stored_spec, *current_spec} if stored_spec.get(k) != current_spec.get(k))
            raise ArtifactError(f"{folder}/features.json: trained on other features than this version of BEAR "
                                f"computes (differing: {', '.join(differing)}); retrain")
        try:
            catalog = parse_catalog(_decode(texts, folder, "catalog.json"), KNOWN_TOKENIZERS)
        except CatalogError as error:
            raise ArtifactError(f"{folder}/catalog.json: {error}") from None
        return PredictorArtifact(
            catalog=catalog,
            projections=_projections(_decode(texts, folder, "projections.json"), catalog, folder),
            accuracy_model=texts[ACCURACY_MODEL],
            log_output_tokens_model=texts[LOG_OUTPUT_TOKENS_MODEL],
            length_distributions=_per_model(_decode(texts, folder, "length_distributions.json"), catalog, folder,
                                            "length_distributions.json", _distribution),
            baselines=_per_model(_decode(texts, folder, "baselines.json"), catalog, folder, "baselines.json",
                                 _baseline),
            training=manifest.get("training", {}),
        )


def _verified_files(folder: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """The artifact's files' texts, each checked against the manifest's checksum, and the manifest."""
    try:
        is_folder = folder.is_dir()
    except OSError as error:  # a name the file system refuses (too long)
        raise ArtifactError(f"{folder}: {error.strerror or error}") from None
    if not is_folder:
        raise ArtifactError(f"{folder}: no such folder (a predictor artifact is a folder written by "
                            f"`bear predictor train`)")
    if not (folder / MANIFEST).is_file():
        raise ArtifactError(f"{folder}: not a predictor artifact ({MANIFEST} is missing)")
    try:
        manifest_text = (folder / MANIFEST).read_text(encoding="utf-8")
        manifest = strict_json.loads(manifest_text)
    except (OSError, UnicodeDecodeError, strict_json.JsonError) as error:
        raise ArtifactError(f"{folder}/{MANIFEST}: unreadable ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{folder}/{MANIFEST}: not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{folder}: artifact format_version {manifest.get('format_version')!r}, this version of "
                            f"BEAR reads {FORMAT_VERSION}; retrain or use a matching BEAR")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ArtifactError(f"{folder}/{MANIFEST}: no file list")
    texts = {MANIFEST: manifest_text}
    for name in FILES:
        if name not in files:
            raise ArtifactError(f"{folder}/{MANIFEST}: does not list {name}")
        try:
            text = (folder / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ArtifactError(f"{folder}/{name}: missing or unreadable ({error})") from None
        if _sha256(text) != files[name]:
            raise ArtifactError(f"{folder}/{name}: corrupt (its SHA-256 differs from the manifest's)")
        texts[name] = text
    return texts, manifest


def _decode(texts: Mapping[str, str], folder: Path, name: str) -> Any:
    try:
        return strict_json.loads(texts[name])
    except strict_json.JsonError as error:
        raise ArtifactError(f"{folder}/{name}: {error}") from None


def _projections(document: Any, catalog: Catalog, folder: Path) -> dict[str, Projection]:
    out = {}
    for name in catalog.tokenizers:
        try:
            entry = document[name]
            projection = Projection(np.array(entry["mean"], dtype=np.float64),
                                    np.array(entry["components"], dtype=np.float64))
        except (KeyError, TypeError, ValueError) as error:
            raise ArtifactError(f"{folder}/projections.json: tokenizer {name!r}: {error}") from None
        if projection.components.shape != (PROJECTION_DIMENSIONS, HASH_DIMENSIONS):
            raise ArtifactError(f"{folder}/projections.json: tokenizer {name!r}: components of shape "
                                f"{projection.components.shape}, expected {(PROJECTION_DIMENSIONS, HASH_DIMENSIONS)}")
        out[name] = projection
    return out


def _per_model(document: Any, catalog: Catalog, folder: Path, file: str,
               parse: Callable[[Any], T]) -> dict[str, T]:
    out = {}
    for name in catalog.names:
        try:
            out[name] = parse(document[name])
        except (KeyError, TypeError, ValueError) as error:
            raise ArtifactError(f"{folder}/{file}: model {name!r}: {error}") from None
    return out


def _distribution(entry: Any) -> LengthDistribution:
    return LengthDistribution(np.array(entry["ratios"], dtype=np.float64), int(entry["tail_points"]),
                              float(entry["scale_to_mean"]))


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (os.umask sets it to read it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _baseline(entry: Any) -> ConstantBaseline:
    accuracy, output_tokens = float(entry["accuracy"]), float(entry["output_tokens"])
    if not (0.0 <= accuracy <= 1.0 and 0.0 <= output_tokens < math.inf):  # also refuses NaN
        raise ValueError(f"accuracy must be in [0, 1] and output_tokens a finite number >= 0, got {accuracy!r} and "
                         f"{output_tokens!r}")
    return ConstantBaseline(accuracy, output_tokens)


def _json(document: Any) -> str:
    return json.dumps(document, indent=1) + "\n"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
