"""Loading programs: a compiled artifact, or the uncompiled program built from settings and data.

The store reads an artifact (manifest, state, fitted parts); here its LMs are
chosen and the program is built with its parts and LMs in one step. Building
the default program's parts (the exemplar index, the emotion prior) from a data
source is workflow work too. ``trace_dspy.load`` is the public way in; the
commands call :func:`load_for_run`, which adds their settings and data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.core.config import ProgramConfig
from trace_dspy.core.console import say
from trace_dspy.lm.specs import LMConfig, LMSet
from trace_dspy.program.parts import FittedParts
from trace_dspy.store.artifacts import check_lm_trust, load_state, locate, read_artifact
from trace_dspy.store.manifest import Manifest


@dataclass
class LoadedProgram:
    """A program ready to call, with its LMs, and the manifest it came from (None: the uncompiled program)."""

    program: dspy.Module
    lms: LMSet
    manifest: Manifest | None = None
    path: Path | None = None
    ref: str = "default"

    @property
    def label(self) -> str:
        """``NAME@vN`` for an artifact, else the reference it was loaded by."""
        return self.manifest.label if self.manifest is not None else self.ref

    def describe(self) -> dict[str, Any]:
        return {"ref": self.ref, "path": str(self.path) if self.path else None,
                "name": self.manifest.name if self.manifest else None,
                "version": self.manifest.version if self.manifest else None}


def build_program(config: ProgramConfig, state: dict[str, Any] | None, *, parts: FittedParts | None = None,
                  stage_lms=None, stage_lms_default: bool = False, where: str = "program.json"):
    """A TraceProgram built with its fitted parts and stage LMs, then given a saved ``state`` (checked).

    The parts come first: the prior decides whether the emotion stage has its
    candidates field, as it did when the state was saved.
    """
    from trace_dspy.program.pipeline import TraceProgram

    program = TraceProgram(config, stage_lms=stage_lms, parts=parts, stage_lms_default=stage_lms_default)
    if state is not None:
        load_state(program, state, where=where)
    return program


def _load_artifact(ref: str, *, lm_config: LMConfig | None = None, root: str | os.PathLike | None = None,
                  tracking_uri: str | None = None, attach_lms: bool = True, trust_lm: bool = False,
                  timeout: float | None = None, stage_lms_default: bool = False,
                  allow_unverified: bool = False) -> LoadedProgram:
    """A compiled program from any reference (see ``trace_dspy.load``), built with its parts and LMs.

    The LM config recorded in the manifest is used only when ``lm_config`` is
    None, and then only if it names no endpoint and no key variable, unless
    ``trust_lm``. With ``attach_lms=False`` the stages use ``dspy.settings``.
    """
    folder = locate(ref, root=root, tracking_uri=tracking_uri, allow_unverified=allow_unverified)
    stored = read_artifact(folder)
    recorded = stored.manifest.lm_config()
    if lm_config is None and not trust_lm:
        check_lm_trust(recorded, folder / "manifest.json")
    if timeout is not None:
        recorded = recorded.with_timeout(timeout)
    lms = LMSet(lm_config or recorded)
    program = build_program(stored.config, stored.state, parts=stored.parts,
                            stage_lms=lms.stage_lms() if attach_lms else None,
                            stage_lms_default=stage_lms_default, where=str(folder / "program.json"))
    if attach_lms and stored.parts["writer_adapter"] is not None:
        # A fine-tuned writer's adapter is checked against the reply stage's model now (an AdapterFileError
        # naming the file), or its not being used said, rather than at the first reply.
        program.writer().stage_lm(program, "generate_response")
    return LoadedProgram(program, lms, stored.manifest, folder, ref)


def default_retriever(config: ProgramConfig, data=None, *, seed: int = 0, announce_seed: bool = True):
    """The exemplar index over the training pool of ``data`` (cached by fingerprint)."""
    if not config.retrieval.enabled:
        return None
    from trace_dspy.data.retrieval import cached_index
    from trace_dspy.data.sources import DataSource, load_splits, resolve_source

    source = data if isinstance(data, DataSource) else resolve_source(data, seed=seed, announce_seed=announce_seed)
    splits = load_splits(source, seed=seed)
    return cached_index(splits.train, config.retrieval, source.fingerprint)


def default_prior(config: ProgramConfig, data=None, *, seed: int = 0):
    """The emotion prior the uncompiled program gets for ``data``: the better on dev of the one fitted on its
    pool (plus the situations named by ``$TRACE_DSPY_SITUATIONS``) and the one shipped in the package; the
    shipped one for a pool too small to fit on (the seed set). See :mod:`trace_dspy.workflows.prior`.

    None, with a note on stderr, when the prior is off or cannot be had; the emotion stage then decides
    alone, and its ``emotion_path`` output says so. Fitting happens once per data set, then it is cached.
    """
    from trace_dspy.data.situations import resolve_situations
    from trace_dspy.data.sources import DataSource, resolve_source
    from trace_dspy.program.emotion_prior import MIN_TRAIN, cached_prior_path
    from trace_dspy.workflows.prior import choose_prior

    if config.prior_k == 0:
        return None
    source = data if isinstance(data, DataSource) else resolve_source(data, seed=seed, announce_seed=False)
    situations = resolve_situations(None)
    fresh = len(source.pool) >= MIN_TRAIN and not cached_prior_path(source, situations=situations,
                                                                     seed=seed).is_file()
    if fresh:
        say(f"emotion prior: fitting on the {len(source.pool)}-sample pool (once per data set, then cached)")
    choice = choose_prior(source, situations=situations, seed=seed, prior_k=config.prior_k)
    if fresh or choice.prior is None:
        say(choice.summary())
    return choice.prior


def default_reference() -> str:
    """The program a command runs when none is named: the newest compiled artifact that did not do worse
    than the uncompiled program on its dev set and did not collapse, else the one an installed package ships
    (:mod:`trace_dspy.store.shipped`), else ``default`` (the uncompiled program).

    ``respond``, ``chat`` and the README's snippet that loads the default all
    reach the same program this way. A compile that does worse on dev than the
    program it started from is saved (it is ``trace-dspy@latest``) but not
    run by default, and it does not become ``champion``.
    """
    from trace_dspy.store.artifacts import (
        DEFAULT_NAME,
        read_manifest,
        search_roots,
        version_dir,
    )
    from trace_dspy.store.artifacts import versions as list_versions
    from trace_dspy.store.errors import ArtifactError

    roots = search_roots()
    for root in roots:
        for number in sorted(list_versions(DEFAULT_NAME, root), reverse=True):
            folder = version_dir(root, DEFAULT_NAME, number)
            try:
                manifest = read_manifest(folder)
            except ArtifactError:
                continue  # a damaged folder is not a default; loading it by name says what is wrong
            if not_worse_than_uncompiled(manifest.dev_score("dev_before"), manifest.dev_score("dev_after")):
                _note_local_default(manifest.label, folder)
                return f"{DEFAULT_NAME}@v{number}" if root == roots[0] else str(folder)
    from trace_dspy.store.shipped import packaged_default

    return packaged_default() or "default"  # an installed wheel carries the default as package data


def _note_local_default(label: str, folder: Path) -> None:
    """Say which program runs when the default is not the one the package ships: a version compiled into the
    checkout's ``artifacts/``, a ``./artifacts`` in the working directory, or ``$TRACE_DSPY_ARTIFACTS``."""
    from trace_dspy.store.artifacts import CHECKOUT_ROOT
    from trace_dspy.store.shipped import SHIPPED_DEFAULT

    if label == SHIPPED_DEFAULT and folder.resolve().is_relative_to(CHECKOUT_ROOT.resolve()):
        return
    say(f"using {label} from {folder} (not the packaged default {SHIPPED_DEFAULT}; --program names another)")


def not_worse_than_uncompiled(before: dict | None, after: dict | None) -> bool:
    """Did a compiled program score at least as well on dev as the uncompiled one it started from (equal
    when the optimizer kept the uncompiled program), without collapsing? ``before``/``after``: dev summaries.

    The one rule behind ``champion`` (compile) and the program respond and chat run by default.
    """
    b, a = (before or {}).get("empathy"), (after or {}).get("empathy")
    return (isinstance(a, (int, float)) and isinstance(b, (int, float)) and a >= b
            and not (after or {}).get("collapsed"))


def load_for_run(ref: str | None, settings, *, tracking_uri: str | None = None, data=None, seed: int = 0,
                 announce_seed: bool = True, root: str | os.PathLike | None = None,
                 attach_lms: bool = True, stage_lms_default: bool = False,
                 remember_openings: bool = False) -> LoadedProgram:
    """What a command runs: the uncompiled program for 'default', else a loaded artifact; None: default_reference().

    Args:
        ref: 'default', an artifact folder or program.json, ``NAME@vN``, ``NAME@latest``, ``champion``,
            ``models:/...`` or ``runs:/...``; None: :func:`default_reference`.
        settings: the command's ``Settings``. Models chosen on the command line (or in an [lm] table,
            ``settings.lm_explicit``) win over the ones an artifact records; ``settings.trust_artifact_lm``
            allows a recorded endpoint or key variable; ``settings.timeout`` applies to recorded LMs too;
            ``settings.allow_unverified_model`` loads a registry or run reference without a digest record.
        data, seed: the data source the uncompiled program retrieves exemplars from and fits its prior on.
        root: where ``NAME@vN`` is looked up. attach_lms: False leaves the stages on ``dspy.settings``.
        stage_lms_default: the attached LMs give way to an LM configured in ``dspy.settings``.
        remember_openings: the program keeps the openings of its replies (``TraceProgram.remember_openings``):
            for the commands whose replies a person reads one after another (respond, chat).

    Returns:
        The program, its LMs and its manifest (``LoadedProgram``).
    """
    loaded = _load_program(ref, settings, tracking_uri=tracking_uri, data=data, seed=seed, announce_seed=announce_seed,
                           root=root, attach_lms=attach_lms, stage_lms_default=stage_lms_default)
    if getattr(settings, "writer", None) and loaded.program.config.writer != settings.writer:
        import dataclasses

        loaded.program.config = dataclasses.replace(loaded.program.config, writer=settings.writer)
    if remember_openings:
        loaded.program.remember_openings()
    return loaded


def _load_program(ref, settings, *, tracking_uri, data, seed, announce_seed, root, attach_lms,
                  stage_lms_default) -> LoadedProgram:
    if ref is None:
        ref = default_reference()
    if ref == "default":
        lms = LMSet(settings.lm)
        parts = FittedParts({"retrieval": default_retriever(settings.program, data, seed=seed,
                                                            announce_seed=announce_seed),
                             "emotion_prior": default_prior(settings.program, data, seed=seed)})
        program = build_program(settings.program, None, parts=parts,
                                stage_lms=lms.stage_lms() if attach_lms else None, stage_lms_default=stage_lms_default)
        return LoadedProgram(program, lms, None, None, "default")
    if data is not None:
        _note_unused_data(ref, data, seed=seed)
    return _load_artifact(ref, lm_config=settings.lm if settings.lm_explicit else None, root=root,
                          tracking_uri=tracking_uri, attach_lms=attach_lms, trust_lm=settings.trust_artifact_lm,
                          timeout=settings.timeout, stage_lms_default=stage_lms_default,
                          allow_unverified=settings.allow_unverified_model)


def _note_unused_data(ref: str, data, *, seed: int) -> None:
    """A data source named for retrieval while an artifact runs: check it (a typo is an error) and say it is unused.

    A compiled artifact retrieves from the exemplar index saved inside it, so
    ``--data`` only changes the uncompiled program. A source that is already
    loaded (evaluate's test data) is used by the caller and needs no note.
    """
    from trace_dspy.data.sources import DataSource, resolve_source

    if isinstance(data, DataSource):
        return
    resolve_source(data, seed=seed, announce_seed=False)  # raises the data error (missing path, bad line)
    say(f"note: {ref} retrieves exemplars from the index saved in it; the data source {data} is not used "
        "(--program default retrieves from it)")
