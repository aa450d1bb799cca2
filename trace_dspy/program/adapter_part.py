"""The fine-tuned writer's adapter as a fitted part: its value, its manifest record, its file's checks, its line.

``compile --optimizer finetune`` trains a LoRA adapter for the embedded model's reply stage
(``trace_dspy.compact.finetune``); the artifact keeps it as ``writer_adapter.gguf`` beside the program, and its
manifest record (the ``writer_adapter`` table) holds the file's size and SHA-256, the base model it was
trained on, the training data's counts by source and the training settings and outcome. The part's class
(``WriterAdapterPart`` in ``trace_dspy.program.parts``) calls the functions here.

Loading checks the file as every artifact file is checked (a regular file inside the folder, within bounds),
then its size and digest against the record, then, with the ``finetune`` extra's ``gguf`` package, that it
reads as a llama.cpp LoRA adapter (``trace_dspy.lm.finetune.gguf_lora``). Whichever check fails, the error
names the file. Whether the adapter fits the base model is checked when the adapted LM is built
(``trace_dspy.lm.finetune.adapted``): the base is the reply stage's LM, chosen at run time.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE_NAME = "writer_adapter.gguf"
_SHA256 = re.compile(r"[0-9a-f]{64}")


class AdapterPartError(ValueError):
    """A saved adapter part that cannot be used: ``args`` are ``(message,)`` or ``(file, field, reason)``, as
    ``trace_dspy.program.parts.PartError`` takes them."""


@dataclass(frozen=True)
class WriterAdapter:
    """A LoRA adapter file for the reply stage, with its size and SHA-256 taken when it was made or loaded."""

    path: Path
    size: int
    sha256: str

    @classmethod
    def of(cls, path: str | os.PathLike) -> WriterAdapter:
        """The adapter at ``path``, its bytes read once for the size and digest."""
        from trace_dspy.core.files import FileCheckError, hash_file
        from trace_dspy.lm.finetune.gguf_lora import MAX_ADAPTER_BYTES

        digest = hashlib.sha256()
        try:
            size = hash_file(digest, path, max_bytes=MAX_ADAPTER_BYTES)
        except FileCheckError as exc:
            raise ValueError(f"{path}: the fine-tuned writer's adapter {exc.reason}") from None
        return cls(Path(path), size, digest.hexdigest())

    def save(self, folder: Path) -> None:
        """Copy the adapter into an artifact folder as ``writer_adapter.gguf``."""
        # file-audit: copies the adapter file a fine-tune just wrote into the new version's private folder
        shutil.copyfile(self.path, folder / FILE_NAME)


def as_adapter(value: Any) -> WriterAdapter | None:
    """A part value: a WriterAdapter, or the path of an adapter file (ValueError when it cannot be read)."""
    if value is None or isinstance(value, WriterAdapter):
        return value
    if isinstance(value, (str, os.PathLike)):
        return WriterAdapter.of(value)
    raise ValueError(f"writer_adapter: expected a LoRA adapter file's path, found {type(value).__name__}")


def adapter_record(value: WriterAdapter | None, fit: dict[str, Any] | None) -> dict[str, Any] | None:
    """The manifest record: how the adapter was trained (``fit``) and its file; None when there is none (an
    older trace-dspy then reads nothing to ignore)."""
    if value is None:
        return None
    return {**(fit or {}), "file": FILE_NAME, "bytes": value.size, "sha256": value.sha256}


def _recorded(folder: Path, record: dict[str, Any]) -> tuple[int, str]:
    """(bytes, sha256) the record holds, each checked; AdapterPartError naming the field otherwise."""
    where = folder / "manifest.json"
    if record.get("file") != FILE_NAME:
        raise AdapterPartError(where, "writer_adapter.file",
                               f"expected {FILE_NAME!r}, found {record.get('file')!r:.80}")
    size, digest = record.get("bytes"), record.get("sha256")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise AdapterPartError(where, "writer_adapter.bytes", f"expected a size in bytes, found {size!r:.40}")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise AdapterPartError(where, "writer_adapter.sha256", f"expected 64 hex digits, found {digest!r:.80}")
    return size, digest


def load_adapter(folder: Path, record: dict[str, Any]) -> WriterAdapter | None:
    """The adapter of an artifact ``folder`` whose manifest ``record`` names one (None when it names none),
    checked: inside the folder, its size and SHA-256 as recorded, a readable LoRA adapter."""
    from trace_dspy.core.files import FileCheckError, hash_file
    from trace_dspy.lm.finetune.gguf_lora import MAX_ADAPTER_BYTES, AdapterFileError

    if not record or record.get("file") is None:
        return None
    size, recorded = _recorded(folder, record)
    path = folder / FILE_NAME
    digest = hashlib.sha256()
    try:
        found = hash_file(digest, path, max_bytes=MAX_ADAPTER_BYTES, root=folder)
    except FileCheckError as exc:
        raise AdapterPartError(f"{path}: the fine-tuned writer's adapter {exc.reason}") from None
    if found != size or digest.hexdigest() != recorded:
        raise AdapterPartError(f"{path}: the fine-tuned writer's adapter is not the file the manifest records "
                               f"({found:,} bytes, sha256 {digest.hexdigest()[:16]}...; recorded {size:,} bytes, "
                               f"sha256 {recorded[:16]}...): damaged or replaced")
    try:
        import gguf  # noqa: F401
    except ImportError:
        pass  # without the finetune extra, llama.cpp's own checks run when the adapter is applied
    else:
        from trace_dspy.lm.finetune.gguf_lora import read_lora_gguf

        try:
            read_lora_gguf(path)
        except AdapterFileError as exc:
            raise AdapterPartError(str(exc)) from None
    return WriterAdapter(path, found, recorded)


def describe_adapter(record: dict[str, Any], program: dict[str, Any]) -> str:
    """One line for ``inspect``: what the writer was trained on and how, from the manifest record alone."""
    if not record or not record.get("file"):
        return "none (the reply stage runs on its LM as it is)"
    lora, counts = (record.get(k) if isinstance(record.get(k), dict) else {} for k in ("lora", "examples"))
    data = " + ".join(f"{n} {source}" for source, n in sorted(counts.items())) or "?"
    loss = record.get("final_loss")
    loss_text = f"{loss:.3f}" if _number(loss) else "-"
    size = f"{record['bytes']:,} bytes" if _number(record.get("bytes")) else "size not recorded"
    return (f"LoRA rank {lora.get('rank', '?')} on {record.get('base_model', '?')}, trained on {data} examples, "
            f"{record.get('steps', '?')} steps, final loss {loss_text} ({record['file']}, {size}); used for the "
            "reply stage on the embedded model under the compact writer")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


__all__ = ["FILE_NAME", "AdapterPartError", "WriterAdapter", "adapter_record", "as_adapter", "describe_adapter",
           "load_adapter"]
