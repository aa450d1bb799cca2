"""Saved context states on disk, so that a fresh process does not read a stage's instructions again.

A stage's system message (its instructions, field list and format) is the same for every dialogue. The engine
keeps the llama.cpp state after it in memory (``trace_dspy.lm.models``); this folder keeps it across processes.
A state is stored under a hash of what it depends on (model file and LoRA adapter, their sizes and modification
times, the llama-cpp-python version, the context size, the attention kernel and the prompt tokens) and restored
only if the tokens stored with it match the prompt exactly. Files are written whole (temporary name, then rename); at most ``MAX_FILES`` are
kept, the least recently used go first. A damaged or unreadable file is ignored and the prefix read again.

The folder is ``$TRACE_DSPY_CACHE/llama-states`` (default ``~/.cache/trace-dspy/llama-states``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from trace_dspy.core.files import open_checked

MAGIC = b"TDSTATE1"
MAX_FILES = 32
# A state holds the KV cache of one system message; a file larger than this is not one of ours.
MAX_STATE_BYTES = 2 * 1024 ** 3
_HEADER = struct.Struct("<8sQQ")  # magic, token count, state bytes


class StateFiles:
    """One model's saved prefix states in a folder."""

    def __init__(self, folder: str | os.PathLike, model_path: str, n_ctx: int, flash_attn: bool = False,
                 adapter: str | None = None):
        import llama_cpp

        self.folder = Path(folder)
        stat = Path(model_path).stat()
        self._identity = f"{Path(model_path).resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{n_ctx}|" \
                         f"{getattr(llama_cpp, '__version__', '?')}|fa={int(bool(flash_attn))}"
        if adapter is not None:  # a LoRA adapter changes every state after the first token
            held = Path(adapter).stat()
            self._identity += f"|lora={Path(adapter).resolve()}|{held.st_size}|{held.st_mtime_ns}"

    def path(self, tokens: list[int]) -> Path:
        digest = hashlib.sha256(self._identity.encode() + np.asarray(tokens, np.int32).tobytes()).hexdigest()
        return self.folder / f"{digest[:32]}.state"

    def load(self, tokens: list[int]) -> tuple | None:
        """The saved state for exactly these prompt tokens, as ``models.save_context`` returns it; or None.

        Only a regular file of at most ``MAX_STATE_BYTES`` whose header's sizes add up to its own is read.
        """
        path = self.path(tokens)
        try:
            fh, file_size = open_checked(path, max_bytes=MAX_STATE_BYTES)
            with fh:
                magic, count, size = _HEADER.unpack(fh.read(_HEADER.size))
                if magic != MAGIC or count != len(tokens) or _HEADER.size + 4 * count + size != file_size:
                    return None
                ids = np.frombuffer(fh.read(4 * count), np.int32)
                if ids.tolist() != list(tokens):
                    return None
                buf = (ctypes.c_uint8 * size)()
                if fh.readinto(buf) != size:
                    return None
            os.utime(path)  # recently used
        except (OSError, struct.error, ValueError):  # a FileCheckError (a file refused) is a ValueError
            return None
        return buf, size, ids.astype(np.intc)

    def save(self, tokens: list[int], saved: tuple) -> None:
        """Store a state (``models.save_context``'s tuple); a full disk or a read-only folder is not an error."""
        buf, size, _ = saved
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # file-audit: a new private temporary file (mkstemp makes it), written whole, then renamed into place
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:  # file-audit: writes the temporary file mkstemp just made
                fh.write(_HEADER.pack(MAGIC, len(tokens), size))
                fh.write(np.asarray(tokens, np.int32).tobytes())
                fh.write(memoryview(buf)[:size])
            os.replace(tmp, self.path(tokens))
            self._prune()
        except OSError:
            try:
                os.unlink(tmp)
            except (OSError, UnboundLocalError):
                pass

    def _prune(self) -> None:
        files = sorted(self.folder.glob("*.state"), key=lambda p: p.stat().st_mtime)
        for old in files[:-MAX_FILES]:
            try:
                old.unlink()
            except OSError:
                pass
