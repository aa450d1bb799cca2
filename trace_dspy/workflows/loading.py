"""What a command runs: the uncompiled program built from settings and data, or a loaded artifact.

Building the default program's runtime parts (the exemplar index, the emotion prior) from a data source is
workflow work; the store layer below only saves and loads artifacts.
"""

from __future__ import annotations

from trace_dspy.core.config import ProgramConfig
from trace_dspy.lm.specs import LMSet
from trace_dspy.store.artifacts import LoadedProgram, build_program, load_reference


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
    import sys

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
        print(f"emotion prior: fitting on the {len(source.pool)}-sample pool (once per data set, then cached)",
              file=sys.stderr)
    choice = choose_prior(source, situations=situations, seed=seed, prior_k=config.prior_k)
    if fresh or choice.prior is None:
        print(choice.summary(), file=sys.stderr)
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
        ArtifactError,
        read_manifest,
        search_roots,
        version_dir,
    )
    from trace_dspy.store.artifacts import versions as list_versions

    roots = search_roots()
    for root in roots:
        for number in sorted(list_versions(DEFAULT_NAME, root), reverse=True):
            folder = version_dir(root, DEFAULT_NAME, number)
            try:
                manifest = read_manifest(folder)
            except ArtifactError:
                continue  # a damaged folder is not a default; loading it by name says what is wrong
            scores = manifest.get("scores") or {}
            if not_worse_than_uncompiled(scores.get("dev_before"), scores.get("dev_after")):
                return f"{DEFAULT_NAME}@v{number}" if root == roots[0] else str(folder)
    from trace_dspy.store.shipped import packaged_default

    return packaged_default() or "default"  # an installed wheel carries the default as package data


def not_worse_than_uncompiled(before: dict | None, after: dict | None) -> bool:
    """Did a compiled program score at least as well on dev as the uncompiled one it started from (equal
    when the optimizer kept the uncompiled program), without collapsing? ``before``/``after``: dev summaries.

    The one rule behind ``champion`` (compile) and the program respond and chat run by default.
    """
    b, a = (before or {}).get("empathy"), (after or {}).get("empathy")
    return (isinstance(a, (int, float)) and isinstance(b, (int, float)) and a >= b
            and not (after or {}).get("collapsed"))


def load_for_run(ref: str | None, settings, *, tracking_uri: str | None = None, data=None, seed: int = 0,
                 announce_seed: bool = True) -> LoadedProgram:
    """What a command runs: the uncompiled program for 'default', else a loaded artifact; None: default_reference().

    The default program retrieves exemplars from the training pool of ``data``.
    Models chosen on the command line (or in an [lm] table) win over the ones
    recorded in the artifact.
    """
    if ref is None:
        ref = default_reference()
    if ref == "default":
        lms = LMSet(settings.lm)
        program = build_program(settings.program, None)
        program.retriever = default_retriever(settings.program, data, seed=seed, announce_seed=announce_seed)
        program.emotion_prior = default_prior(settings.program, data, seed=seed)
        program.set_stage_lms(lms.stage_lms())
        return LoadedProgram(program, lms, {}, None, "default")
    if data is not None:
        _note_unused_data(ref, data, seed=seed)
    return load_reference(ref, lm_config=settings.lm if settings.lm_explicit else None, tracking_uri=tracking_uri,
                          trust_lm=settings.trust_artifact_lm, timeout=settings.timeout)


def _note_unused_data(ref: str, data, *, seed: int) -> None:
    """A data source named for retrieval while an artifact runs: check it (a typo is an error) and say it is unused.

    A compiled artifact retrieves from the exemplar index saved inside it, so
    ``--data`` only changes the uncompiled program. A source that is already
    loaded (evaluate's test data) is used by the caller and needs no note.
    """
    import sys

    from trace_dspy.data.sources import DataSource, resolve_source

    if isinstance(data, DataSource):
        return
    resolve_source(data, seed=seed, announce_seed=False)  # raises the data error (missing path, bad line)
    print(f"note: {ref} retrieves exemplars from the index saved in it; the data source {data} is not used "
          "(--program default retrieves from it)", file=sys.stderr)
