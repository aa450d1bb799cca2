"""Reading untrusted text safely: bounded JSON, masked secrets, terminal-safe output.

Everything a user or a downloaded artifact hands us passes through here
before it is parsed, logged or printed:

- ``load_json`` parses JSON with a size and a nesting limit, so that a
  crafted line (``[[[[...``) is one clear error naming ``file:line`` instead
  of a ``RecursionError`` that ends the whole run.
- ``redact`` masks credentials: ``user:password@`` in URLs, the values of
  API-key environment variables (and of every variable an LM was told to read
  its key from, whatever its name) wherever they appear in a message, and
  shortens a message that would carry megabytes of model output.
- ``terminal_safe`` makes control characters, terminal escape sequences and
  bidirectional-text controls visible (``\\x1b``, ``\\u202e``) instead of
  letting them act on the user's terminal; ``json_safe_dumps`` is its JSON
  form, which keeps every other character (``café``, emoji) readable.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
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

# Every pattern below runs in time linear in the text: each can start only where the
# previous character is not part of the same run (a lookbehind, checked in constant time), and
# each run is scanned once with possessive quantifiers, never retried from inside.
#
# scheme://user:password@ -> scheme://***@ (a scheme character just before "://").
_URL_CREDENTIALS = re.compile(r"(?<=[A-Za-z0-9+.-])://[^/\s@]++@")
# user:password@host without its scheme, as HTTP clients quote it in connection errors. A run
# free of whitespace, "/", "@" and quotes, from its first character to the "@"; one that starts
# with colons keeps them (the second pattern).
_BARE_CREDENTIALS = re.compile(r"(?<![^\s/@'\"])[^\s/@:'\"]++:[^\s/@'\"]++@(?=[\w\[])")
_BARE_AFTER_COLONS = re.compile(r"(?<![^\s/@'\"])(:++)[^\s/@:'\"]++:[^\s/@'\"]++@(?=[\w\[])")
# Environment variables whose values are credentials wherever they appear: a name with one of
# these words as a part (OPENAI_API_KEY, OPENAI_API_KEY_2, LLM_CRED, DB_PASSWORD_FILE) or ending
# in one (APIKEY, GITHUBTOKEN).
_SECRET_WORDS = "KEY|KEYS|APIKEY|TOKEN|TOKENS|SECRET|SECRETS|PASSWORD|PASSWD|CRED|CREDS|CREDENTIAL|CREDENTIALS"
_SECRET_ENV = re.compile(rf"(?:^|_)(?:{_SECRET_WORDS})(?:_|$)|(?:KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)
_MIN_SECRET_LEN = 8
# Longest message that redact returns; a longer one keeps its start and says how long it was.
MAX_MESSAGE_CHARS = 1000

# Names of variables that hold a key, registered by whoever reads one (an LM built with
# api_key_env), and literal secret values (a URL's password): masked by every redact call.
_REGISTRY_LOCK = threading.Lock()
_SECRET_NAMES: set[str] = set()
_SECRET_LITERALS: set[str] = set()


def register_secret_name(name: str | None) -> None:
    """Mask the value of environment variable ``name`` wherever text is redacted, whatever its name."""
    if name:
        with _REGISTRY_LOCK:
            _SECRET_NAMES.add(name)


def register_secret_value(value: str | None) -> None:
    """Mask ``value`` itself (a password from a URL) wherever text is redacted."""
    if value and len(value) >= _MIN_SECRET_LEN:
        with _REGISTRY_LOCK:
            _SECRET_LITERALS.add(value)


def register_url_credentials(url: str | None) -> None:
    """Mask the password of ``url`` (``scheme://user:password@host``) and the HTTP Basic token made of
    it, should a server echo that header."""
    if not url or "@" not in url:
        return
    import base64
    from urllib.parse import unquote, urlsplit

    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return
    for value in (password, unquote(password or "")):
        register_secret_value(value)
    if user is not None and password is not None:
        for pair in (f"{user}:{password}", f"{unquote(user)}:{unquote(password)}"):
            register_secret_value(base64.b64encode(pair.encode()).decode())


def secret_values(extra_names: tuple[str, ...] = ()) -> list[str]:
    """Values of the environment variables that hold credentials, and the registered secrets (longest first)."""
    with _REGISTRY_LOCK:
        registered, literals = set(_SECRET_NAMES), set(_SECRET_LITERALS)
    names = {n for n in os.environ if _SECRET_ENV.search(n)} | registered | set(extra_names)
    values = {os.environ.get(n, "") for n in names} | literals
    return sorted((v for v in values if len(v) >= _MIN_SECRET_LEN), key=len, reverse=True)


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} ... ({len(text):,} characters)"


def redact(text: str, extra_names: tuple[str, ...] = (), *, limit: int | None = MAX_MESSAGE_CHARS) -> str:
    """Mask URL credentials and the values of key variables in ``text``; then shorten it to ``limit``
    characters (None: whole). Linear in the length of ``text``."""
    if not text:
        return text
    if "@" in text:  # every credential pattern ends in "@"
        text = _URL_CREDENTIALS.sub("://***@", text)
        text = _BARE_CREDENTIALS.sub("***@", text)
        text = _BARE_AFTER_COLONS.sub(r"\1***@", text)
    for value in secret_values(extra_names):
        # The value as it is, and as JSON quotes it (trace attributes are JSON text).
        for form in {value, json.dumps(value)[1:-1]}:
            if form in text:
                text = text.replace(form, "***")
    return shorten(text, limit) if limit is not None else text


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from (``__cause__``, else ``__context__``), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def redact_exception(exc: BaseException) -> BaseException:
    """Mask credentials in ``exc`` and the exceptions it was raised from, in place; returns ``exc``.

    Its message (``args`` and a ``message`` attribute, as HTTP clients keep one) is redacted but not
    shortened, so that whoever records the exception (a trace, a log, an error row) sees masked text.
    """
    for current in exception_chain(exc):
        try:
            args = current.args
            masked = tuple(redact(a, limit=None) if isinstance(a, str) else a for a in args)
            if masked != args:
                current.args = masked
            message = getattr(current, "message", None)
            if isinstance(message, str):
                cleaned = redact(message, limit=None)
                if cleaned != message:
                    current.message = cleaned
        except Exception:  # noqa: BLE001 - an exception type with read-only fields stays as it is
            pass
    return exc


# ---------------------------------------------------------------- terminals

# Bidirectional-text controls: the embeddings and overrides (U+202A-U+202E), the isolates (U+2066-U+2069) and
# the marks (U+200E, U+200F, U+061C). They reorder what the terminal shows (a right-to-left override makes
# "gpj.exe" read as "exe.jpg"), so they are shown as escapes like the controls that move the cursor.
_BIDI_CODES = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_BIDI_CONTROLS = "".join(map(chr, _BIDI_CODES))
# C0 controls except tab and newline, DEL, the C1 controls (which include CSI, U+009B), and the bidi controls.
_CONTROL = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_BIDI_CONTROLS}]")
# The same characters as JSON escapes; json.dumps escapes C0 controls itself (ESC becomes \\u001b).
_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in (*range(0x7F, 0xA0), *_BIDI_CODES)}


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """Show control characters and bidi controls as escapes (``\\x1b``, ``\\u202e``), so that output cannot
    drive the terminal or reorder what it shows; every other character, tab and newline stay as they are."""
    return _CONTROL.sub(lambda m: _escape(m.group()), text)


def json_safe_dumps(value: Any, **options: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **options)`` with the characters ``terminal_safe`` escapes
    written as JSON escapes (``\\u009b``, ``\\u202e``): the same data once parsed, harmless on a terminal, and
    ``café`` or emoji still readable."""
    return json.dumps(value, ensure_ascii=False, **options).translate(_JSON_ESCAPES)


__all__ = [
    "JSONLimitError", "MAX_JSON_DEPTH", "MAX_MESSAGE_CHARS", "exception_chain", "json_safe_dumps", "load_json",
    "redact", "redact_exception", "register_secret_name", "register_secret_value", "register_url_credentials",
    "secret_values", "shorten", "terminal_safe",
]
