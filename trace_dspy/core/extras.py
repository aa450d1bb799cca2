"""The command that installs an optional extra, for the way this package was installed.

A source checkout (an editable install, or the folder on ``sys.path``) installs extras with
``pip install -e ".[embed]"`` in the checkout; a package installed from a wheel or an sdist file gets that file
with the extra; one installed from an index gets ``pip install "trace-dspy[embed]"``. Reading the answer
touches only the package's own files and metadata.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

DISTRIBUTION = "trace-dspy"
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def from_checkout() -> bool:
    """Is this package the ``trace_dspy/`` folder of a source checkout (pyproject.toml beside it)?"""
    return (_PACKAGE_ROOT.parent / "pyproject.toml").is_file()


@functools.cache
def install_hint(extra: str) -> str:
    """``pip install ...`` that adds ``extra`` to this installation."""
    if from_checkout():
        return f'pip install -e ".[{extra}]"'
    source = _installed_from_file()
    return f'pip install "{source or DISTRIBUTION}[{extra}]"'


def _installed_from_file() -> str | None:
    """The local wheel or sdist this package was installed from (PEP 610's direct_url.json), else None."""
    from importlib import metadata

    try:
        # file-audit: importlib.metadata reads the installed distribution's own record (PEP 610)
        text = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        url = json.loads(text)["url"] if text else ""
    except (metadata.PackageNotFoundError, ValueError, KeyError, TypeError):
        return None
    if not url.startswith("file://"):
        return None
    from urllib.parse import unquote, urlparse

    path = unquote(urlparse(url).path)
    return path if Path(path).is_file() else None
