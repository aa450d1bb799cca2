"""Reading untrusted text safely: bounded JSON, masked secrets, terminal-safe output.

Everything a user or a downloaded artifact hands us passes through here
before it is parsed, logged or printed:

- ``load_json`` parses JSON with a size and a nesting limit, so that a
  crafted line (``[[[[...``) is one clear error naming ``file:line`` instead
  of a ``RecursionError`` that ends the whole run.
- ``redact`` masks credentials: ``user:password@`` in URLs, and the values of
  API-key environment variables wherever they appear in a message.
- ``terminal_safe`` makes control characters and terminal escape sequences
  visible (``\\x1b``) instead of letting them act on the user's terminal.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

MAX_JSON_DEPTH = 64
MAX_LINE_BYTES = 4 * 1024 * 1024


class JSONLimitError(ValueError):
    """JSON that is invalid, too large or nested too deeply; the message says where."""


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item)
    return deepest


def load_json(data: str | bytes, where: str, *, max_bytes: int = MAX_LINE_BYTES, max_depth: int = MAX_JSON_DEPTH):
    """``json.loads`` with limits; every failure is a ``JSONLimitError`` that starts with ``where``."""
    size = len(data)
    if size > max_bytes:
        raise JSONLimitError(f"{where}: {size:,} bytes is more than the {max_bytes:,} allowed")
    try:
        # Bytes are UTF-8 (json.loads would guess UTF-16 or UTF-32 from NUL bytes).
        value = json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
    except RecursionError:
        raise JSONLimitError(f"{where}: JSON nested more than {max_depth} levels deep") from None
    except UnicodeDecodeError as exc:
        raise JSONLimitError(f"{where}: not valid UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise JSONLimitError(f"{where}: invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if _depth(value) > max_depth:
        raise JSONLimitError(f"{where}: JSON nested more than {max_depth} levels deep")
    return value


# ---------------------------------------------------------------- secrets

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")
# user:password@host without its scheme, as HTTP clients quote it in connection errors.
_BARE_CREDENTIALS = re.compile(r"(?<![\w.+-])[^\s/@:'\"]+:[^\s/@'\"]+@(?=[\w\[])")
# Environment variables whose values are credentials wherever they appear.
_SECRET_ENV = re.compile(r"(API_KEY|_KEY|_TOKEN|_SECRET|PASSWORD)$", re.IGNORECASE)
_MIN_SECRET_LEN = 8


def secret_values(extra_names: tuple[str, ...] = ()) -> list[str]:
    """Values of the environment variables that hold credentials (longest first)."""
    names = {n for n in os.environ if _SECRET_ENV.search(n)} | set(extra_names)
    values = {os.environ.get(n, "") for n in names}
    return sorted((v for v in values if len(v) >= _MIN_SECRET_LEN), key=len, reverse=True)


def redact(text: str, extra_names: tuple[str, ...] = ()) -> str:
    """Mask URL credentials and the values of key variables in ``text``."""
    if not text:
        return text
    text = _URL_CREDENTIALS.sub(lambda m: m.group("scheme") + "***@", text)
    text = _BARE_CREDENTIALS.sub("***@", text)
    for value in secret_values(extra_names):
        text = text.replace(value, "***")
    return text


# ---------------------------------------------------------------- terminals

# C0 controls except tab and newline, DEL, and the C1 controls (which include CSI, U+009B).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """Show control characters as escapes, so that output cannot drive the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


__all__ = ["JSONLimitError", "MAX_JSON_DEPTH", "load_json", "redact", "secret_values", "terminal_safe"]
