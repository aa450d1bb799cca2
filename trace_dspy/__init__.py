"""trace-dspy: TRACE empathetic response generation as a compiled DSPy program.

Importing this package has no side effects: no model is loaded, no file is
read, nothing is configured.
"""

from trace_dspy.core.config import ProgramConfig
from trace_dspy.program.pipeline import TraceProgram

__version__ = "0.1.0"
__all__ = ["ProgramConfig", "TraceProgram", "__version__", "load"]


def load(ref: str | None = None, **kwargs):
    """Load a compiled program, ready to call: see :func:`trace_dspy.store.artifacts.load`.

    ``ref``: an artifact folder or program.json, ``NAME@vN``, ``NAME@latest``,
    ``champion``, ``models:/NAME/VERSION``, ``models:/NAME@ALIAS`` or ``runs:/RUN_ID``.
    None: the program ``respond`` and ``chat`` run by default (the newest
    artifact that did not do worse than the uncompiled program on its dev set,
    else the uncompiled program on the embedded model and the seed set).
    """
    from trace_dspy.store.artifacts import load as _load

    if ref is None:
        from trace_dspy.workflows.loading import default_reference

        ref = default_reference()
        if ref == "default":
            from trace_dspy.workflows.loading import load_for_run
            from trace_dspy.workflows.settings import Settings

            if kwargs:
                raise TypeError(f"load() of the uncompiled default takes no options, not {', '.join(kwargs)}")
            return load_for_run("default", Settings(), announce_seed=False).program
    return _load(ref, **kwargs)
