"""The one weights-file format: numeric arrays plus a JSON header, written and read by trace_dspy.core.files."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from trace_dspy.core.files import ArrayLimits, load_header_npz, read_header_npz, write_header_npz


class Broken(ValueError):
    pass


def test_written_files_read_back_with_their_header_and_arrays(tmp_path):
    arrays = {"w": np.arange(6, dtype=np.float16).reshape(2, 3), "b": np.ones(3, np.float32)}
    path = write_header_npz(tmp_path / "x.npz", {"z": 1, "a": ["é"]}, arrays)
    assert not list(tmp_path.glob("*.tmp"))
    with zipfile.ZipFile(path) as archive:
        assert archive.namelist() == ["w.npy", "b.npy", "header.npy"]
        header = np.load(archive.open("header.npy"))
    assert header.dtype == np.uint8 and header.tobytes() == json.dumps({"z": 1, "a": ["é"]}, sort_keys=True).encode()
    meta, read = read_header_npz(path, ("w", "b"))
    assert meta == {"a": ["é"], "z": 1}
    assert read["w"].dtype == np.float16 and np.array_equal(read["w"], arrays["w"])


def test_the_shipped_weight_files_still_load_in_this_format():
    from trace_dspy.optimize.empathy import WEIGHTS_FILE as empathy
    from trace_dspy.optimize.relevance import WEIGHTS_FILE as relevance
    from trace_dspy.program.emotion_prior import FILE_NAME, SHIPPED

    for path, names in ((empathy, ("mean", "scale", "weights", "bias")), (relevance, ("A", "B", "C", "w")),
                        (SHIPPED, ("idf", "weights", "bias"))):
        meta, arrays = read_header_npz(path, names)
        assert "feature_version" in meta and set(arrays) == set(names)
    assert SHIPPED.name == FILE_NAME


def test_load_names_the_caller_s_error_for_missing_damaged_and_non_finite_files(tmp_path):
    with pytest.raises(Broken, match=r"^thing not found: .*nope.npz \(refit\)$"):
        load_header_npz(tmp_path / "nope.npz", ("w",), limits=ArrayLimits(), error=Broken, what="thing",
                        hint=" (refit)")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(Broken, match=r"bad.npz: damaged thing: not a valid .npz file"):
        load_header_npz(tmp_path / "bad.npz", ("w",), limits=ArrayLimits(), error=Broken, what="thing")
    nan = write_header_npz(tmp_path / "nan.npz", {}, {"w": np.array([1.0, np.nan])})
    assert np.isnan(load_header_npz(nan, ("w",), limits=ArrayLimits(), error=Broken, what="thing")[1]["w"][1])
    with pytest.raises(Broken, match=r"nan.npz\[w\]: damaged thing: holds non-finite values"):
        load_header_npz(nan, ("w",), limits=ArrayLimits(), error=Broken, what="thing", finite=True)
