"""The compiled program an installed package carries, for when no artifacts folder holds one.

A wheel has no ``artifacts/`` folder, so it carries the checkout's default program (the artifact ``respond``
and ``chat`` run when none is named) as package data in ``trace_dspy/default_program/``; pyproject.toml maps
that package to the artifact's folder. A source checkout finds the same program in its own ``artifacts/``
and never needs this.

Which program runs is said once per process on stderr: the packaged one, or, when the package carries none
and no artifacts folder holds one, the uncompiled program with the fitted parts the package ships (the
emotion prior, the scorer heads).
"""

from __future__ import annotations

from pathlib import Path

from trace_dspy.core.console import say

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "default_program"
MANIFEST = "manifest.json"
# The program the package ships: the version pyproject.toml maps to trace_dspy.default_program (a test holds the
# two together). In a checkout, a newer version a user compiled into artifacts/ runs instead, and says so.
SHIPPED_DEFAULT = "trace-dspy@v6"

_announced: set[str] = set()


def packaged_program() -> Path | None:
    """The folder of the compiled program this installation carries, or None (a checkout, or a partial install)."""
    return PACKAGE_DIR if (PACKAGE_DIR / MANIFEST).is_file() else None


def packaged_default() -> str | None:
    """The reference of the packaged program for the default, saying which program runs.

    The folder's path when the package carries a program, else None after a note that the uncompiled program
    runs. Says nothing in a source checkout, whose own ``artifacts/`` folder is where its default lives.
    """
    folder = packaged_program()
    if folder is not None:
        _announce(f"trace-dspy: running the compiled program shipped in the package ({_label(folder)})")
        return str(folder)
    if not _in_checkout():
        _announce("trace-dspy: no compiled program found (none in ./artifacts, none shipped in the package); "
                  "running the uncompiled program with the shipped emotion prior and scorers")
    return None


def _label(folder: Path) -> str:
    """``NAME@vN`` from the folder's manifest, or the folder when the manifest cannot be read."""
    import json

    from trace_dspy.core.files import read_bytes

    try:  # a FileCheckError (not a regular file, too large) is a ValueError
        # The bound of trace_dspy.store.artifacts.MAX_MANIFEST_BYTES, without importing DSPy for a label.
        manifest = json.loads(read_bytes(folder / MANIFEST, max_bytes=2 * 1024 * 1024, root=folder))
        return f"{manifest['name']}@v{int(manifest['version'])}"
    except (OSError, ValueError, KeyError, TypeError):
        return str(folder)


def _in_checkout() -> bool:
    from trace_dspy.core.extras import from_checkout

    return from_checkout()


def _announce(line: str) -> None:
    if line not in _announced:
        _announced.add(line)
        say(line)
