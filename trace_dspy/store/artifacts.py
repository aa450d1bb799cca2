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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.core.config import ConfigError, ProgramConfig
from trace_dspy.lm.specs import LMConfig, LMSet
from trace_dspy.store.errors import ArtifactError

SCHEMA_VERSION = 1
ENV_ROOT = "TRACE_DSPY_ARTIFACTS"
DEFAULT_NAME = "trace-dspy"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_VERSION_DIR = re.compile(r"^v(\d{4,})$")
REQUIRED_MANIFEST_KEYS = ("schema_version", "name", "version", "created", "config", "predictors")


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
    with open(path, "w", encoding="utf-8") as fh:
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


def save_artifact(program: dspy.Module, manifest: dict[str, Any], **options: Any) -> Path:
    """Write a new immutable version; returns its folder (``write_artifact``, same options, also returns
    the manifest as written)."""
    return write_artifact(program, manifest, **options)[0]


def write_artifact(
    program: dspy.Module,
    manifest: dict[str, Any],
    *,
    name: str = DEFAULT_NAME,
    root: str | os.PathLike | None = None,
    extra_files: dict[str, Path] | None = None,
    extra_dirs: dict[str, Path] | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Write a new immutable version: (its folder, the manifest as written, version number included).

    The files go to a private temporary folder that is renamed into place in one step, so a crash leaves
    either a complete version or none (a stale ``.tmp-*`` folder, removed by the next save).
    """
    folder = artifacts_root(root) / check_name(name)
    folder.mkdir(parents=True, exist_ok=True)
    _clean_stale_tmp(folder)
    tmp = folder / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        program.save(str(tmp / "program.json"))
        state = json.loads((tmp / "program.json").read_text())
        for name_, src in (extra_files or {}).items():
            shutil.copyfile(src, tmp / name_)
        for name_, src in (extra_dirs or {}).items():
            shutil.copytree(src, tmp / name_)
        for _attempt in range(1000):
            number = (versions(name, root) or [0])[-1] + 1
            record = {
                "schema_version": SCHEMA_VERSION,
                "name": name,
                "version": number,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "git_commit": git_commit(),
                "packages": package_versions(),
                "predictors": sorted(k for k in state if k != "metadata"),
                **manifest,
            }
            _write_json(tmp / "manifest.json", record)
            target = version_dir(root, name, number)
            try:
                os.rename(tmp, target)  # atomic; fails if another writer took the number
                return target, record
            except OSError:
                if not target.exists():
                    raise
        raise ArtifactError(f"could not allocate a version under {folder}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---------------------------------------------------------------- loading


@dataclass
class LoadedProgram:
    program: dspy.Module
    lms: LMSet
    manifest: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    ref: str = "default"

    def describe(self) -> dict[str, Any]:
        return {"ref": self.ref, "path": str(self.path) if self.path else None,
                "name": self.manifest.get("name"), "version": self.manifest.get("version")}


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


# Manifest fields and the JSON types they must have (required ones first; None = may be null).
_MANIFEST_SCHEMA: dict[str, tuple[type, ...]] = {
    "schema_version": (int,), "name": (str,), "version": (int,), "created": (str,), "config": (dict,),
    "predictors": (list,), "git_commit": (str, type(None)), "packages": (dict,), "optimizer": (dict,),
    "metric": (dict,), "scores": (dict,), "data": (dict,), "mlflow": (dict,), "command": (str,),
    "retrieval": (dict,), "emotion_prior": (dict,), "reply_openers": (dict,),
    "reply_plans": (dict,),
}


def _check_type(path: Path, field_: str, value: Any, types: tuple[type, ...]) -> None:
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        names = " or ".join("null" if t is type(None) else {"dict": "object", "list": "list", "str": "text",
                                                              "int": "integer"}.get(t.__name__, t.__name__)
                            for t in types)
        raise ArtifactError(path, field_, f"expected {names}, found {type(value).__name__}")


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest, checked against its schema (field by field)."""
    path = folder / "manifest.json"
    manifest = _read_json_object(folder, "manifest.json", "manifest.json is missing; not an artifact folder",
                                 MAX_MANIFEST_BYTES)
    missing = [k for k in REQUIRED_MANIFEST_KEYS if k not in manifest]
    if missing:
        raise ArtifactError(f"{path}: missing {', '.join(missing)}")
    for key, types in _MANIFEST_SCHEMA.items():
        if key in manifest:
            _check_type(path, key, manifest[key], types)
    if manifest["schema_version"] != SCHEMA_VERSION:
        raise ArtifactError(f"{path}: schema version {manifest['schema_version']} is not "
                            f"supported (this trace-dspy reads {SCHEMA_VERSION})")
    for i, name in enumerate(manifest["predictors"]):
        _check_type(path, f"predictors[{i}]", name, (str,))
    for key in ("program", "lm"):
        if manifest["config"].get(key) is not None:
            _check_type(path, f"config.{key}", manifest["config"][key], (dict,))
    for key, value in (manifest.get("packages") or {}).items():
        _check_type(path, f"packages.{key}", value, (str,))
    for table, key in (("retrieval", "index"), ("emotion_prior", "file")):
        value = (manifest.get(table) or {}).get(key)
        if value is not None and not isinstance(value, (str, bool)):
            raise ArtifactError(path, f"{table}.{key}", f"expected text, found {type(value).__name__}")
    return manifest


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
        _check_type(Path(where), f"{pname}.signature", signature, (dict,))
        instructions = signature.get("instructions")
        if instructions is not None:
            _check_type(Path(where), f"{pname}.signature.instructions", instructions, (str,))
            if len(instructions) > MAX_TEXT_CHARS:
                raise ArtifactError(where, f"{pname}.signature.instructions", "longer than "
                                                                              f"{MAX_TEXT_CHARS:,} characters")
        fields_ = signature.get("fields", [])
        _check_type(Path(where), f"{pname}.signature.fields", fields_, (list,))
        for i, item in enumerate(fields_):
            _check_type(Path(where), f"{pname}.signature.fields[{i}]", item, (dict,))
            for key in ("prefix", "description"):
                if key in item:
                    _check_type(Path(where), f"{pname}.signature.fields[{i}].{key}", item[key], (str,))


def build_program(config: ProgramConfig, state: dict[str, Any] | None, *, where: str = "program.json",
                  emotion_prior=None):
    """Rebuild a TraceProgram and load a state into it, checking the structure.

    The prior is attached first: it decides whether the emotion stage has its
    candidates field, as it did when the state was saved.
    """
    from trace_dspy.program.pipeline import TraceProgram

    program = TraceProgram(config, emotion_prior=emotion_prior)
    if state is None:
        return program
    expected = sorted(name for name, _ in program.named_predictors())
    found = sorted(k for k in state if k != "metadata")
    if expected != found:
        raise ArtifactError(f"{where}: predictors {found} do not match the program's {expected}")
    for pname, predictor in program.named_predictors():
        entry = state[pname]
        _check_predictor_state(where, pname, entry)
        try:
            # LMs come from the manifest's config, never from a state file.
            predictor.load_state({**entry, "lm": None})
        except Exception as exc:
            raise ArtifactError(f"{where}: predictor {pname!r} cannot be loaded: {exc}") from None
    return program


def _warn_on_drift(manifest: dict[str, Any], where: Path) -> None:
    import warnings

    saved = (manifest.get("packages") or {}).get("dspy")
    installed = package_versions().get("dspy")
    if saved and installed and saved != installed:
        warnings.warn(f"{where} was compiled with dspy {saved}; dspy {installed} is installed. "
                      "Prompts may render differently; recompile if scores change.", stacklevel=3)


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


def load_folder(folder: Path, *, lm_config: LMConfig | None = None, ref: str | None = None,
                attach_lms: bool = True, trust_lm: bool = False, timeout: float | None = None) -> LoadedProgram:
    """Load one artifact folder.

    Its recorded LM config is used only when ``lm_config`` is None, and then
    only if it names no endpoint and no key variable, unless ``trust_lm``.
    """
    manifest = read_manifest(folder)
    _warn_on_drift(manifest, folder)
    state = read_program_state(folder)
    try:
        saved_program = dict(manifest["config"].get("program") or {})
        # Saved before reply_format existed: keep the field layout it was compiled with.
        saved_program.setdefault("reply_format", "fields")
        # Saved before the emotion prior existed: no candidates field in its stage.
        saved_program.setdefault("prior_k", 0)
        # ... and before Best-of-N replies: one reply, as it was evaluated.
        saved_program.setdefault("best_of", 1)
        # ... and before the chat writer saw the retrieved exemplars.
        saved_program.setdefault("reply_exemplars", False)
        config = ProgramConfig.from_dict(saved_program)
    except (ConfigError, AttributeError, TypeError) as exc:
        raise ArtifactError(f"{folder / 'manifest.json'}: invalid config: {exc}") from None
    try:
        # Type and bounds of every recorded LM setting (num_retries, timeout, api_base, local ...).
        recorded_lm = LMConfig.from_dict(manifest["config"].get("lm"))
    except (ConfigError, AttributeError, TypeError) as exc:
        raise ArtifactError(folder / "manifest.json", "config.lm", f"invalid config: {exc}") from None
    if lm_config is None and not trust_lm:
        check_lm_trust(recorded_lm, folder / "manifest.json")
    if timeout is not None:
        recorded_lm = recorded_lm.with_timeout(timeout)
    program = build_program(config, state, where=str(folder / "program.json"),
                            emotion_prior=_load_prior(folder, manifest, config))
    program.reply_openers = _load_openers(folder, manifest)
    program.reply_plans = _load_plans(folder, manifest)
    if config.retrieval.enabled and (folder / "index").is_dir():
        from trace_dspy.data.retrieval import ExemplarIndex

        try:
            program.retriever = ExemplarIndex.load(folder / "index", root=folder)
        except ConfigError as exc:
            raise ArtifactError(str(exc)) from None
    elif config.retrieval.enabled and manifest.get("retrieval", {}).get("index"):
        raise ArtifactError(f"{folder}: the retrieval index (index/) is missing")
    lms = LMSet(lm_config or recorded_lm)
    if attach_lms:
        program.set_stage_lms(lms.stage_lms())
    return LoadedProgram(program, lms, manifest, folder, ref or str(folder))


def _load_openers(folder: Path, manifest: dict[str, Any]):
    """The scaffolded reply's fitted openers; None (the stock ones) for artifacts compiled without them."""
    from trace_dspy.core.openers import check_openers

    openers = (manifest.get("reply_openers") or {}).get("openers")
    if openers is None:
        return None
    try:
        return check_openers(openers)
    except ValueError as exc:
        raise ArtifactError(folder / "manifest.json", "reply_openers.openers", str(exc)) from None


def _load_plans(folder: Path, manifest: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The further reply plans a compile chose; () (the LM's plan only) for artifacts compiled without them."""
    from trace_dspy.core.labels import check_plans

    plans = (manifest.get("reply_plans") or {}).get("plans")
    if plans is None:
        return ()
    try:
        return check_plans(plans)
    except ValueError as exc:
        raise ArtifactError(folder / "manifest.json", "reply_plans.plans", str(exc)) from None


def _load_prior(folder: Path, manifest: dict[str, Any], config: ProgramConfig):
    """The artifact's fitted emotion prior; None for artifacts compiled without one."""
    from trace_dspy.program.emotion_prior import FILE_NAME, EmotionPrior, PriorError

    path = folder / FILE_NAME
    recorded = (manifest.get("emotion_prior") or {}).get("file")
    if not os.path.lexists(path):
        if recorded:
            raise ArtifactError(f"{folder}: the emotion prior ({FILE_NAME}) is missing")
        return None
    try:
        return EmotionPrior.load(path, root=folder)
    except PriorError as exc:
        raise ArtifactError(str(exc)) from None


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


def load(ref: str, *, lm_config: LMConfig | None = None, root: str | os.PathLike | None = None,
         tracking_uri: str | None = None, attach_lms: bool = True, trust_lm: bool = False) -> dspy.Module:
    """Load a compiled program, ready to call, from any reference.

    ``ref``: an artifact folder or program.json; ``NAME@vN``; ``NAME@latest``;
    ``champion`` (the registry alias); ``models:/NAME/VERSION`` or
    ``models:/NAME@ALIAS``; ``runs:/RUN_ID``. The configured LMs from the
    manifest are reattached unless ``lm_config`` replaces them; with
    ``attach_lms=False`` the program uses whatever LM ``dspy.settings`` holds.

    An artifact may say which model it was compiled for, but not where to send
    requests or which key to read: one whose LM config names an ``api_base``
    or an ``api_key_env`` is refused (``ArtifactError``) unless you pass
    ``lm_config`` yourself or ``trust_lm=True``.
    """
    return load_reference(ref, lm_config=lm_config, root=root, tracking_uri=tracking_uri,
                          attach_lms=attach_lms, trust_lm=trust_lm).program


def load_reference(ref: str, *, lm_config: LMConfig | None = None, root: str | os.PathLike | None = None,
                   tracking_uri: str | None = None, attach_lms: bool = True, trust_lm: bool = False,
                   timeout: float | None = None) -> LoadedProgram:
    if ref == "champion" or ref.startswith(("models:/", "runs:/")):
        from trace_dspy.store.registry import fetch_artifact

        folder = fetch_artifact(ref, tracking_uri=tracking_uri)
    else:
        folder = resolve_local(ref, root)
    return load_folder(folder, lm_config=lm_config, ref=ref, attach_lms=attach_lms, trust_lm=trust_lm,
                       timeout=timeout)
