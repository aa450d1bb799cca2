"""Every ``TRACE_DSPY_*`` environment variable, named once, with readers.

Code refers to a variable by the constant here, never by its spelled-out name, so that
``VARIABLES`` is the complete list (a test checks this). The readers only read: each caller
keeps its own range check and error message, and a flag on the command line still wins over
the variable, which wins over a config file and the default.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

# data
DATA = "TRACE_DSPY_DATA"
SITUATIONS = "TRACE_DSPY_SITUATIONS"
EPITOME = "TRACE_DSPY_EPITOME"
# files this package writes
ARTIFACTS = "TRACE_DSPY_ARTIFACTS"
CACHE = "TRACE_DSPY_CACHE"
STORE_WAIT = "TRACE_DSPY_STORE_WAIT"
# the LM a served or batch-loaded program answers with
LM = "TRACE_DSPY_LM"
API_BASE = "TRACE_DSPY_API_BASE"
API_KEY_ENV = "TRACE_DSPY_API_KEY_ENV"
TIMEOUT = "TRACE_DSPY_TIMEOUT"
LM_CACHE = "TRACE_DSPY_LM_CACHE"
TRUST_ARTIFACT_LM = "TRACE_DSPY_TRUST_ARTIFACT_LM"
THREADS = "TRACE_DSPY_THREADS"
REQUEST_TIMEOUT = "TRACE_DSPY_REQUEST_TIMEOUT"
BUSY_WAIT = "TRACE_DSPY_BUSY_WAIT"
# benchmarks and tests
SCALE_FAKE_KEY = "TRACE_DSPY_SCALE_FAKE_KEY"
SCREENSHOTS = "TRACE_DSPY_SCREENSHOTS"

VARIABLES: dict[str, str] = {
    DATA: "EmpatheticDialogues data (a folder of CSVs, a JSONL file or hf:NAME) used when --data is not given",
    SITUATIONS: "a situations CSV for the emotion prior when --situations is not given ('none': no file)",
    EPITOME: "the folder with the EPITOME Reddit CSVs when --epitome is not given",
    ARTIFACTS: "the artifact root when --artifacts-dir is not given (default ./artifacts)",
    CACHE: "where retrieval indexes and emotion priors are cached (default ~/.cache/trace-dspy)",
    STORE_WAIT: "seconds to wait for a locked sqlite tracking store (0 to 3600, default 20)",
    LM: "the model a served program answers with (a dspy.LM model string, or 'local')",
    API_BASE: "the API base URL of that model",
    API_KEY_ENV: "the name of the variable that holds that model's key (never the key itself)",
    TIMEOUT: "seconds one request to that model may take",
    LM_CACHE: "0 turns DSPy's answer cache off for that model, 1 keeps it on",
    TRUST_ARTIFACT_LM: "1: use the endpoint and key variable a loaded artifact records",
    THREADS: "rows one loaded model answers at once (default 1)",
    REQUEST_TIMEOUT: "seconds one predict call of a served model may run",
    BUSY_WAIT: "seconds a predict call waits for a model busy with another call (default 5)",
    SCALE_FAKE_KEY: "the placeholder key variable the scale benchmark's fake remote LM names",
    SCREENSHOTS: "a folder the MLflow UI test also copies its screenshots to",
}

TRUE_WORDS = ("1", "true", "yes")


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def value(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's value as set, or None when it is unset or empty."""
    return _env(environ).get(name) or None


def text(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The variable's value without surrounding blanks; "" when unset."""
    return _env(environ).get(name, "").strip()


def flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the variable is set to 1, true or yes (any case)."""
    return text(name, environ).lower() in TRUE_WORDS


def number(name: str, environ: Mapping[str, str] | None = None) -> float | None:
    """The variable as a number: None when unset or blank, NaN when it is not a number (callers refuse it)."""
    raw = text(name, environ)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        return math.nan


def cache_root() -> Path:
    """The folder that holds this package's caches: ``$TRACE_DSPY_CACHE``, else ``~/.cache/trace-dspy``."""
    return Path(value(CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "trace-dspy"))


def cache_dir(kind: str) -> Path:
    """The cache folder for ``kind`` (``index``, ``emotion-prior``) under ``$TRACE_DSPY_CACHE``."""
    return cache_root() / kind


__all__ = [
    "API_BASE", "API_KEY_ENV", "ARTIFACTS", "BUSY_WAIT", "CACHE", "DATA", "EPITOME", "LM", "LM_CACHE",
    "REQUEST_TIMEOUT", "SCALE_FAKE_KEY", "SCREENSHOTS", "SITUATIONS", "STORE_WAIT", "THREADS", "TIMEOUT",
    "TRUE_WORDS", "TRUST_ARTIFACT_LM", "VARIABLES", "cache_dir", "cache_root", "flag", "number", "text", "value",
]
