"""A trained LightGBM model evaluated through LightGBM's C API, for the routing path.

`lightgbm.Booster.predict` spends 20–120 µs per call in Python-side checks and conversions; the C API's single-row
path (`LGBM_BoosterPredictForMatSingleRowFast`, configured once per model) costs a few µs. Rows are scored one call each
up to SINGLE_ROW_MAX rows and in one `LGBM_BoosterPredictForMat` call beyond; both walk the same trees in the same
order and give the same numbers as `Booster.predict` (tests/unit/predictor/test_compiled_booster.py).

This module owns its handles: it loads the model from its text into a booster of its own and frees it on close. A lock
makes one model safe to call from several threads (the single-row configuration is shared); calls on it take turns.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
from pathlib import Path

import numpy as np

_PREDICT_NORMAL = 0  # C_API_PREDICT_NORMAL
_DTYPE_FLOAT64 = 1  # C_API_DTYPE_FLOAT64
_ALL_ITERATIONS = -1
SINGLE_ROW_MAX = 8
_PARAMETERS = b"num_threads=1"


class BoosterError(RuntimeError):
    """LightGBM refused a model or a prediction; the message is LightGBM's."""


class CompiledBooster:
    def __init__(self, model_text: str, num_features: int) -> None:
        problem = model_text_problem(model_text)
        if problem is not None:  # LightGBM's loader trusts these: it crashed the process (SIGSEGV, SIGABRT) on them
            raise BoosterError(f"malformed model text: {problem}")
        lib = _library()
        self._lib = lib
        self._lock = threading.Lock()
        self._handle = ctypes.c_void_p()
        self._fast = ctypes.c_void_p()
        iterations = ctypes.c_int()
        _check(lib, lib.LGBM_BoosterLoadModelFromString(model_text.encode(), ctypes.byref(iterations),
                                                         ctypes.byref(self._handle)))
        stored = ctypes.c_int()
        _check(lib, lib.LGBM_BoosterGetNumFeature(self._handle, ctypes.byref(stored)))
        if stored.value != num_features:
            self._free()
            raise BoosterError(f"the model expects {stored.value} features, the feature spec has {num_features}")
        self.num_features = num_features
        self.num_iterations = iterations.value
        _check(lib, lib.LGBM_BoosterPredictForMatSingleRowFastInit(
            self._handle, _PREDICT_NORMAL, 0, _ALL_ITERATIONS, _DTYPE_FLOAT64, num_features, _PARAMETERS,
            ctypes.byref(self._fast)))

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """One prediction per row of `rows` (n, num_features), float64."""
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != self.num_features:
            raise ValueError(f"expected rows of {self.num_features} features, got shape {rows.shape}")
        out = np.empty(rows.shape[0], dtype=np.float64)
        out_len = ctypes.c_int64()
        with self._lock:
            if not self._handle:
                raise BoosterError("the model is closed")
            self._predict_into(rows, out, out_len)
        return out

    def _predict_into(self, rows: np.ndarray, out: np.ndarray, out_len: ctypes.c_int64) -> None:
        if rows.shape[0] <= SINGLE_ROW_MAX:
            stride = rows.strides[0]
            base = rows.ctypes.data
            out_base = out.ctypes.data
            for i in range(rows.shape[0]):
                _check(self._lib, self._lib.LGBM_BoosterPredictForMatSingleRowFast(
                    self._fast, base + i * stride, ctypes.byref(out_len), out_base + i * 8))
        elif rows.shape[0] > 0:
            _check(self._lib, self._lib.LGBM_BoosterPredictForMat(
                self._handle, rows.ctypes.data, _DTYPE_FLOAT64, rows.shape[0], self.num_features, 1, _PREDICT_NORMAL,
                0, _ALL_ITERATIONS, _PARAMETERS, ctypes.byref(out_len), out.ctypes.data))

    def close(self) -> None:
        with self._lock:
            self._free()

    def _free(self) -> None:
        if self._fast:
            self._lib.LGBM_FastConfigFree(self._fast)
            self._fast = ctypes.c_void_p()
        if self._handle:
            self._lib.LGBM_BoosterFree(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self) -> None:
        if hasattr(self, "_lock"):
            self._free()


# The per-split arrays of a tree (num_leaves - 1 entries each) and its per-leaf ones (num_leaves)
_SPLIT_ARRAYS = ("split_feature", "threshold", "decision_type", "left_child", "right_child")
_LEAF_ARRAYS = ("leaf_value",)


def model_text_problem(text: str) -> str | None:
    """What in a LightGBM text model its loader would read past or index with (and crash the process), or None:
    the header's tree_sizes against the tree blocks' offsets, and each tree's array lengths, child indices and
    feature indices against its num_leaves and the header's max_feature_idx. Not a full check of the format: what
    LightGBM itself checks it reports as an error."""
    data = text.encode()
    if not data.startswith(b"tree\n"):
        return "it does not start with 'tree'"
    end = data.find(b"\nend of trees")
    first = data.find(b"\nTree=0\n")
    if end < 0 or first < 0 or first > end:
        return "no trees, or no 'end of trees'"
    header = dict(_key_values(data[:first]))
    try:
        max_feature = int(header.get(b"max_feature_idx", b""))
        sizes = [int(size) for size in header[b"tree_sizes"].split()] if b"tree_sizes" in header else None
    except ValueError:
        return "max_feature_idx or tree_sizes is not a number"
    blocks = data[first + 1:end + 1].split(b"\n\n\n")
    blocks = [block for block in blocks if block.strip()]
    if sizes is not None:
        offset = first + 1
        for index, size in enumerate(sizes):
            if size <= 0 or not data.startswith(f"Tree={index}\n".encode(), offset):
                return f"tree_sizes does not match tree {index}'s place"
            offset += size
        if offset != end + 1 or len(sizes) != len(blocks):
            return f"tree_sizes ({len(sizes)} trees) does not match the {len(blocks)} trees"
    for index, block in enumerate(blocks):
        problem = _tree_problem(dict(_key_values(block)), max_feature)
        if problem is not None:
            return f"tree {index}: {problem}"
    return None


def _key_values(block: bytes) -> list[tuple[bytes, bytes]]:
    return [tuple(line.split(b"=", 1)) for line in block.split(b"\n") if b"=" in line]  # type: ignore[misc]


def _tree_problem(tree: dict[bytes, bytes], max_feature: int) -> str | None:
    try:
        leaves = int(tree.get(b"num_leaves", b""))
        arrays = {name: [float(v) for v in tree.get(name.encode(), b"").split()]
                  for name in (*_SPLIT_ARRAYS, *_LEAF_ARRAYS)}
    except ValueError:
        return "num_leaves or an array holds no number"
    if leaves < 1:
        return f"num_leaves is {leaves}"
    if len(arrays["leaf_value"]) != leaves:
        return f"{len(arrays['leaf_value'])} leaf values for {leaves} leaves"
    if leaves == 1:
        return None
    for name in _SPLIT_ARRAYS:
        if len(arrays[name]) != leaves - 1:
            return f"{name} has {len(arrays[name])} entries for {leaves - 1} splits"
    for name in ("left_child", "right_child"):  # a split's index (>= 0) or ~leaf (< 0)
        if not all(-leaves <= child < leaves - 1 and child == int(child) for child in arrays[name]):
            return f"{name} names a node the tree does not have"
    if not all(0 <= feature <= max_feature and feature == int(feature) for feature in arrays["split_feature"]):
        return "split_feature names a feature the model does not have"
    return None


def _check(lib: ctypes.CDLL, status: int) -> None:
    if status != 0:
        raise BoosterError(lib.LGBM_GetLastError().decode(errors="replace"))


@functools.cache
def _library() -> ctypes.CDLL:
    """lib_lightgbm from the installed lightgbm wheel, with the signatures this module calls."""
    import lightgbm

    name = {"win32": "lib_lightgbm.dll", "darwin": "lib_lightgbm.dylib"}.get(sys.platform, "lib_lightgbm.so")
    folder = Path(lightgbm.__file__).resolve().parent
    candidates = [folder / "lib" / name, folder / "bin" / name, folder.parent / name]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise BoosterError(f"{name} not found in the installed lightgbm package ({folder})")
    lib = ctypes.CDLL(str(path))
    p, i, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int32, ctypes.c_int64
    signatures = {
        "LGBM_BoosterLoadModelFromString": [ctypes.c_char_p, ctypes.POINTER(i), ctypes.POINTER(p)],
        "LGBM_BoosterGetNumFeature": [p, ctypes.POINTER(i)],
        "LGBM_BoosterPredictForMatSingleRowFastInit": [p, i, i, i, i, i32, ctypes.c_char_p, ctypes.POINTER(p)],
        "LGBM_BoosterPredictForMatSingleRowFast": [p, p, ctypes.POINTER(i64), p],
        "LGBM_BoosterPredictForMat": [p, p, i, i32, i32, i, i, i, i, ctypes.c_char_p, ctypes.POINTER(i64), p],
        "LGBM_FastConfigFree": [p],
        "LGBM_BoosterFree": [p],
    }
    for function, argtypes in signatures.items():
        getattr(lib, function).argtypes = argtypes
        getattr(lib, function).restype = ctypes.c_int
    lib.LGBM_GetLastError.argtypes = []
    lib.LGBM_GetLastError.restype = ctypes.c_char_p
    return lib
