"""trace-dspy: TRACE empathetic response generation as a compiled DSPy program.

Importing this package has no side effects: no model is loaded, no file is
read, nothing is configured.
"""

from trace_dspy.core.config import ProgramConfig
from trace_dspy.program.pipeline import TraceProgram

__version__ = "0.1.0"
__all__ = ["ProgramConfig", "TraceProgram", "__version__", "load"]


def load(ref: str | None = None, *, lm_config=None, root=None, tracking_uri: str | None = None,
         attach_lms: bool = True, trust_lm: bool = False, allow_unverified: bool = False):
    """Load a compiled program, ready to call.

    Args:
        ref: an artifact folder or program.json, ``NAME@vN``, ``NAME@latest``, ``champion`` (the registry
            alias), ``models:/NAME/VERSION``, ``models:/NAME@ALIAS`` or ``runs:/RUN_ID``. None: the program
            ``respond`` and ``chat`` run by default (the newest artifact that did not do worse than the
            uncompiled program on its dev set, else the uncompiled program on the embedded model and the
            seed set).
        lm_config: an ``LMConfig`` that replaces the models the artifact records. Without it the recorded
            models are a default: while an LM is configured in DSPy (``dspy.configure(lm=...)`` or
            ``dspy.context(lm=...)``), every stage runs on that one.
        root: where ``NAME@vN`` is looked up (default: ``$TRACE_DSPY_ARTIFACTS``, else ./artifacts, then the
            checkout's).
        tracking_uri: the MLflow store for ``champion``, ``models:/`` and ``runs:/``.
        attach_lms: False leaves every stage on the LM in ``dspy.settings``.
        trust_lm: use an endpoint or key variable the artifact records. Without it (or ``lm_config``), such
            an artifact is refused with an ``ArtifactError``: endpoints and keys come from you.
        allow_unverified: load a ``champion``, ``models:/`` or ``runs:/`` reference whose files have no
            sha256 record in the store, unchecked, with a warning on stderr. Without it such a reference is
            refused with an ``ArtifactError``; a file that differs from its record is refused either way.

    Returns:
        A ``TraceProgram``; call it with ``dialogue=...``.

    Example:
        >>> program = trace_dspy.load("trace-dspy@v6")
        >>> program(dialogue="Speaker: I failed my driving test again.").response
    """
    from trace_dspy.workflows.loading import default_reference, load_for_run
    from trace_dspy.workflows.settings import Settings

    if ref is None:
        ref = default_reference()
    settings = Settings(lm_explicit=lm_config is not None, trust_artifact_lm=trust_lm,
                        allow_unverified_model=allow_unverified,
                        **({"lm": lm_config} if lm_config is not None else {}))
    return load_for_run(ref, settings, tracking_uri=tracking_uri, root=root, attach_lms=attach_lms,
                        announce_seed=False, stage_lms_default=lm_config is None).program
