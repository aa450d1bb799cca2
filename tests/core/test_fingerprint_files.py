"""fingerprint_files: the name data sets are recorded by (the ED source, EPITOME), from each file's name and
bytes, in order, read bounded."""

from __future__ import annotations

import hashlib

import pytest

from trace_dspy.core.files import FileCheckError, fingerprint_files


def test_the_fingerprint_covers_each_file_s_name_and_bytes_in_order(tmp_path):
    a, b = tmp_path / "valid.csv", tmp_path / "test.csv"
    a.write_bytes(b"one\n")
    b.write_bytes(b"two\n")
    expected = "sha256:" + hashlib.sha256(b"valid.csvone\ntest.csvtwo\n").hexdigest()[:16]
    assert fingerprint_files([a, b], max_bytes=100) == expected
    assert fingerprint_files([b, a], max_bytes=100) != expected
    renamed = tmp_path / "other.csv"
    a.rename(renamed)
    assert fingerprint_files([renamed, b], max_bytes=100) != expected


def test_a_file_over_the_limit_or_not_a_file_is_a_file_check_error(tmp_path):
    big = tmp_path / "big.csv"
    big.write_bytes(b"x" * 11)
    with pytest.raises(FileCheckError, match="big.csv"):
        fingerprint_files([big], max_bytes=10)
    with pytest.raises(FileCheckError, match="missing.csv"):
        fingerprint_files([tmp_path / "missing.csv"], max_bytes=10)
