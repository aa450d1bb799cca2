"""The one error type of the store layer, below both artifacts and registry so neither imports the other."""

from __future__ import annotations

from typing import Any


class ArtifactError(ValueError):
    """An artifact reference cannot be resolved, or its files are damaged.

    ``ArtifactError(message)``, or ``ArtifactError(file, field, reason)`` when
    one field of one file is wrong; then ``file``, ``field`` and ``reason`` are
    set and the message reads ``file: field: reason``.
    """

    def __init__(self, file_or_message: Any, field: str | None = None, reason: str | None = None):
        self.file = str(file_or_message) if reason is not None else None
        self.field, self.reason = field, reason
        super().__init__(f"{file_or_message}: {field}: {reason}" if reason is not None else str(file_or_message))
