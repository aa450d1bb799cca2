"""Versioned program artifacts: ``artifacts/<name>/vNNNN/{program.json, manifest.json}``.

- ``program.json`` is DSPy's state-only JSON (instructions and demos per
  predictor): diffable, and loaded without unpickling anything.
- ``manifest.json`` holds what is needed to rebuild and trust the program: the
  program and LM config (never a key), the optimizer and its settings, the
  metric and the dev scores, the data fingerprint, versions, the git commit and
  the MLflow run and registry version.

Versions are immutable and numbered without gaps. A version is written in a
private temporary folder and appears by one atomic rename; if another compile
took that number in the meantime, the rename fails and the next number is
tried. An interrupted compile therefore leaves no half-written version.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.core import env
from trace_dspy.core.config import ProgramConfig
from trace_dspy.lm.specs import LMConfig
from trace_dspy.program.parts import FittedParts, PartError
from trace_dspy.store.errors import ArtifactError
from trace_dspy.store.manifest import Manifest, check_type

ENV_ROOT = env.ARTIFACTS
DEFAULT_NAME = "trace-dspy"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_VERSION_DIR = re.compile(r"^v(\d{4,})$")


# The flag (and keyword) that lets an artifact's recorded endpoint and key variable be used.
TRUST_FLAG = "--trust-artifact-lm"
# Bounds on what an artifact's files may hold (far above anything a compile writes).
MAX_MANIFEST_BYTES = 2 * 1024 * 1024
MAX_STATE_BYTES = 64 * 1024 * 1024
MAX_DEMOS = 64
MAX_TEXT_CHARS = 100_000


def artifacts_root(root: str | os.PathLike | None = None) -> Path:
    return Path(root or os.environ.get(ENV_ROOT) or "artifacts")


# The checkout's own artifacts/ folder (editable installs): the committed,
# compiled program is found from any working directory.
CHECKOUT_ROOT = Path(__file__).resolve().parents[2] / "artifacts"


def search_roots(root: str | os.PathLike | None = None) -> list[Path]:
    """Where NAME@vN references are looked up: the given/configured root, then the checkout's."""
    roots = [artifacts_root(root)]
    if root is None and CHECKOUT_ROOT.is_dir() and CHECKOUT_ROOT.resolve() != roots[0].resolve():
        roots.append(CHECKOUT_ROOT)
    return roots


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise ArtifactError(f"artifact name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    return name


def version_dir(root: str | os.PathLike | None, name: str, number: int) -> Path:
    """The folder of version ``number`` of ``name`` under ``root`` (``artifacts/NAME/vNNNN``)."""
    return artifacts_root(root) / name / f"v{number:04d}"


def versions(name: str, root: str | os.PathLike | None = None) -> list[int]:
    """Version numbers under ``root/name``; a symbolic link is not a version (see ``resolve_local``)."""
    folder = artifacts_root(root) / check_name(name)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir()
                  if p.is_dir() and not p.is_symlink() and (m := _VERSION_DIR.match(p.name)))


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=cwd or Path(__file__).resolve().parent)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=5, cwd=cwd or Path(__file__).resolve().parent).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("trace-dspy", "dspy", "mlflow", "litellm", "llama-cpp-python"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def _write_json(path: Path, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:  # file-audit: writes a new file in a private temporary folder
        json.dump(data, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


def _clean_stale_tmp(folder: Path) -> None:
    for tmp in folder.glob(".tmp-*"):
        try:
            pid = int(tmp.name.split("-")[1])
            os.kill(pid, 0)  # still running: leave it alone
        except (ValueError, IndexError):
            continue
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:
            continue


def save_artifact(program: dspy.Module, manifest: Manifest | dict[str, Any], **options: Any) -> Path:
    """Write a new immutable version; returns its folder (``write_artifact``, same options, also returns
    the manifest as written)."""
    return write_artifact(program, manifest, **options)[0]


def _as_manifest(manifest: Manifest | dict[str, Any], name: str) -> Manifest:
    """A manifest given as a dict of its fields (parts as top-level tables, as in the JSON) made typed."""
    if isinstance(manifest, Manifest):
        return manifest
    from dataclasses import fields as fields_of

    from trace_dspy.program.parts import part_names

    known = {f.name for f in fields_of(Manifest)} - {"parts", "extra", "path", "name"}
    return Manifest(name=name, **{k: v for k, v in manifest.items() if k in known},
                    parts={k: manifest[k] for k in part_names() if k in manifest},
                    extra={k: v for k, v in manifest.items() if k not in known and k not in part_names()
                           and k != "name"})


def write_artifact(
    program: dspy.Module,
    manifest: Manifest | dict[str, Any],
    *,
    name: str = DEFAULT_NAME,
    root: str | os.PathLike | None = None,
    parts: FittedParts | None = None,
    extra_files: dict[str, Path] | None = None,
    extra_dirs: dict[str, Path] | None = None,
) -> tuple[Path, Manifest]:
    """Write a new immutable version: (its folder, the manifest as written, version number included).

    ``manifest`` gets the name, version, creation time, git commit, package
    versions and predictor names here; ``parts`` (the program's fitted parts)
    are saved into the folder and their records put in the manifest. The files
    go to a private temporary folder that is renamed into place in one step, so
    a crash leaves either a complete version or none (a stale ``.tmp-*``
    folder, removed by the next save).
    """
    from dataclasses import replace

    from trace_dspy.core.files import read_bytes

    manifest = _as_manifest(manifest, name)
    folder = artifacts_root(root) / check_name(name)
    folder.mkdir(parents=True, exist_ok=True)
    _clean_stale_tmp(folder)
    tmp = folder / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        program.save(str(tmp / "program.json"))
        state = json.loads(read_bytes(tmp / "program.json", max_bytes=MAX_STATE_BYTES, root=tmp))
        if parts is not None:
            manifest = replace(manifest, parts={**manifest.parts, **parts.save(tmp, program.config)})
        for name_, src in (extra_files or {}).items():
            # file-audit: copies a file the calling workflow just wrote (compile's dev rows) into the new version
            shutil.copyfile(src, tmp / name_)
        for name_, src in (extra_dirs or {}).items():
            # file-audit: copies a folder the calling workflow just wrote into the new version
            shutil.copytree(src, tmp / name_)
        manifest = replace(manifest, name=name, git_commit=git_commit(), packages=package_versions(),
                           predictors=tuple(sorted(k for k in state if k != "metadata")))
        for _attempt in range(1000):
            number = (versions(name, root) or [0])[-1] + 1
            record = replace(manifest, version=number,
                             created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
            _write_json(tmp / "manifest.json", record.to_dict())
            target = version_dir(root, name, number)
            try:
                os.rename(tmp, target)  # atomic; fails if another writer took the number
                return target, replace(record, path=target / "manifest.json")
            except OSError:
                if not target.exists():
                    raise
        raise ArtifactError(f"could not allocate a version under {folder}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class StoredArtifact:
    """What an artifact folder holds, read and checked: the manifest, the program state and the fitted parts.

    No program is built and no LM is made here: ``trace_dspy.workflows.loading`` does both.
    """

    folder: Path
    manifest: Manifest
    config: ProgramConfig
    state: dict[str, Any]
    parts: FittedParts


def _read_json_object(folder: Path, name: str, missing: str, max_bytes: int) -> dict[str, Any]:
    from trace_dspy.core.files import FileCheckError, read_bytes
    from trace_dspy.core.safety import JSONLimitError, load_json

    path = folder / name
    if not os.path.lexists(path):
        raise ArtifactError(f"{folder}: {missing}")
    try:
        raw = read_bytes(path, max_bytes=max_bytes, root=folder)
    except FileCheckError as exc:
        raise ArtifactError(path, "(file)", exc.reason) from None
    try:
        data = load_json(raw, str(path), max_bytes=max_bytes)
    except JSONLimitError as exc:
        raise ArtifactError(f"{path}: damaged or truncated JSON ({str(exc).removeprefix(f'{path}: ')})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object")
    return data


def read_manifest(folder: Path) -> Manifest:
    """The folder's manifest, checked field by field and migrated (``ArtifactError`` names the file and field)."""
    raw = _read_json_object(folder, "manifest.json", "manifest.json is missing; not an artifact folder",
                            MAX_MANIFEST_BYTES)
    return Manifest.from_dict(raw, folder / "manifest.json")


def read_program_state(folder: Path) -> dict[str, Any]:
    return _read_json_object(folder, "program.json", "program.json is missing", MAX_STATE_BYTES)


def _check_demo(where: str, field_: str, demo: Any) -> None:
    """A demo is an object of text, numbers, booleans, nulls and lists of those."""
    if not isinstance(demo, dict):
        raise ArtifactError(where, field_, f"a demo must be an object, found {type(demo).__name__}")
    for key, value in demo.items():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if item is not None and not isinstance(item, (str, int, float, bool)):
                raise ArtifactError(where, f"{field_}.{key}", f"expected text, a number or a list of them, "
                                                              f"found {type(item).__name__}")
            if isinstance(item, str) and len(item) > MAX_TEXT_CHARS:
                raise ArtifactError(where, f"{field_}.{key}", f"{len(item):,} characters is more than the "
                                                              f"{MAX_TEXT_CHARS:,} allowed")


def _check_predictor_state(where: str, pname: str, entry: Any) -> None:
    if not isinstance(entry, dict) or "demos" not in entry or not isinstance(entry["demos"], list):
        raise ArtifactError(f"{where}: predictor {pname!r} has no valid state")
    if len(entry["demos"]) > MAX_DEMOS:
        raise ArtifactError(where, f"{pname}.demos", f"{len(entry['demos'])} demos is more than the {MAX_DEMOS} allowed")
    for i, demo in enumerate(entry["demos"]):
        _check_demo(where, f"{pname}.demos[{i}]", demo)
    signature = entry.get("signature")
    if signature is not None:
        check_type(Path(where), f"{pname}.signature", signature, (dict,))
        instructions = signature.get("instructions")
        if instructions is not None:
            check_type(Path(where), f"{pname}.signature.instructions", instructions, (str,))
            if len(instructions) > MAX_TEXT_CHARS:
                raise ArtifactError(where, f"{pname}.signature.instructions", "longer than "
                                                                              f"{MAX_TEXT_CHARS:,} characters")
        fields_ = signature.get("fields", [])
        check_type(Path(where), f"{pname}.signature.fields", fields_, (list,))
        for i, item in enumerate(fields_):
            check_type(Path(where), f"{pname}.signature.fields[{i}]", item, (dict,))
            for key in ("prefix", "description"):
                if key in item:
                    check_type(Path(where), f"{pname}.signature.fields[{i}].{key}", item[key], (str,))


def load_state(program: dspy.Module, state: dict[str, Any], *, where: str = "program.json") -> None:
    """Load a saved ``state`` (``program.json``) into ``program``, checking its structure first.

    The predictors must be the program's, and each one's demos and
    instructions must be within bounds; ``ArtifactError`` names what is wrong.
    LMs are never taken from a state file.
    """
    expected = sorted(name for name, _ in program.named_predictors())
    found = sorted(k for k in state if k != "metadata")
    if expected != found:
        raise ArtifactError(f"{where}: predictors {found} do not match the program's {expected}")
    for pname, predictor in program.named_predictors():
        entry = state[pname]
        _check_predictor_state(where, pname, entry)
        try:
            predictor.load_state({**entry, "lm": None})
        except Exception as exc:
            raise ArtifactError(f"{where}: predictor {pname!r} cannot be loaded: {exc}") from None


def _warn_on_drift(manifest: Manifest, where: Path) -> None:
    import warnings

    saved = manifest.packages.get("dspy")
    installed = package_versions().get("dspy")
    if saved and installed and saved != installed:
        warnings.warn(f"{where} was compiled with dspy {saved}; dspy {installed} is installed. "
                      "Prompts may render differently; recompile if scores change.", stacklevel=4)


def check_lm_trust(recorded: LMConfig, manifest_path: Path) -> None:
    """Refuse an artifact that names an endpoint or a key variable (the user chooses those)."""
    from trace_dspy.lm.specs import redact_url

    named = []
    for role, spec in recorded.specs():
        if spec.api_base:
            named.append(f"{role} sends requests to {redact_url(spec.api_base)}")
        if spec.api_key_env:
            named.append(f"{role} reads its key from ${spec.api_key_env}")
    if named:
        raise ArtifactError(manifest_path, "config.lm", (
            f"the artifact says where to send your requests and which key to use ({'; '.join(named)}). "
            "trace-dspy takes endpoints and keys only from you: choose the model with --lm, --api-base and "
            f"--api-key-env (or an [lm] table), or pass {TRUST_FLAG} (trust_lm=True in Python) to use the "
            "recorded ones if you made this artifact yourself"))


def read_artifact(folder: Path) -> StoredArtifact:
    """Read and check one artifact folder: its manifest, program state and fitted parts.

    Raises ``ArtifactError`` naming the file (and field) that is missing or
    damaged. Warns when the artifact was compiled with another dspy version.
    """
    manifest = read_manifest(folder)
    _warn_on_drift(manifest, folder)
    state = read_program_state(folder)
    config = manifest.program_config()
    manifest.lm_config()  # every recorded LM setting is checked before anything is built
    try:
        parts = FittedParts.load(folder, manifest.parts, config)
    except PartError as exc:
        raise (ArtifactError(exc.file, exc.field, exc.reason) if exc.reason is not None
               else ArtifactError(str(exc))) from None
    _warn_on_unknown_parts(manifest, folder)
    return StoredArtifact(folder, manifest, config, state, parts)


def _warn_on_unknown_parts(manifest: Manifest, folder: Path) -> None:
    """One warning line naming the manifest's tables that no registered kind of part reads: parts that a newer
    trace-dspy fitted and this one leaves out (the program runs without them)."""
    from trace_dspy.core.console import say
    from trace_dspy.program.parts import part_names

    unknown = sorted(name for name, value in manifest.extra.items() if isinstance(value, dict))
    if unknown:
        named = ", ".join(f"{name!r} (kind {name}: not registered)" for name in unknown)
        say(f"warning: {folder / 'manifest.json'}: ignoring fitted part(s) {named}; this trace-dspy knows the "
            f"kinds {', '.join(part_names())}, so the program runs without them (a newer trace-dspy wrote them?)")


def resolve_local(ref: str, root: str | os.PathLike | None = None) -> Path:
    """A folder for a path or ``name@vN`` / ``name@latest`` reference."""
    path = Path(ref)
    if path.name == "program.json" and path.is_file():
        return path.parent
    if path.is_dir():
        return path
    if "@" in ref and "/" not in ref:
        name, _, which = ref.partition("@")
        for base_ in search_roots(root):
            links = sorted(p for p in (base_ / check_name(name)).glob("v*") if p.is_symlink())
            if links:
                raise ArtifactError(links[0], "(folder)", f"is a symbolic link to {os.path.realpath(links[0])}; "
                                    "versions must be real folders. Remove the link, or load that folder by its "
                                    "path if you trust it")
        base = next((r for r in search_roots(root) if versions(name, r)), None)
        if base is None:
            raise ArtifactError(f"no versions of {name!r} under {', '.join(map(str, search_roots(root)))}")
        have = versions(name, base)
        if which == "latest":
            number = have[-1]
        elif re.fullmatch(r"v?\d+", which):
            number = int(which.lstrip("v"))
            if number not in have:
                raise ArtifactError(f"{name} has no version {number}; it has {', '.join(f'v{v}' for v in have)}")
        else:
            raise ArtifactError(f"{ref!r}: use {name}@vN or {name}@latest")
        return version_dir(base, name, number)
    raise ArtifactError(
        f"cannot resolve program {ref!r}: give 'default', an artifact folder, a program.json, "
        "NAME@vN, NAME@latest, 'champion', models:/NAME/VERSION or runs:/RUN_ID"
    )


def locate(ref: str, *, root: str | os.PathLike | None = None, tracking_uri: str | None = None,
           allow_unverified: bool = False) -> Path:
    """The artifact folder of any load reference: a folder or program.json, ``NAME@vN``, ``NAME@latest``,
    ``champion``, ``models:/NAME/VERSION``, ``models:/NAME@ALIAS`` or ``runs:/RUN_ID`` (fetched from MLflow;
    ``allow_unverified``: see :func:`trace_dspy.store.registry.fetch_artifact`)."""
    if ref == "champion" or ref.startswith(("models:/", "runs:/")):
        from trace_dspy.store.registry import fetch_artifact

        return fetch_artifact(ref, tracking_uri=tracking_uri, allow_unverified=allow_unverified)
    return resolve_local(ref, root)
