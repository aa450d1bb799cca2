"""What kind of model an LM is, as far as the program's writer needs to know.

``is_embedded``: the LM runs the embedded llama.cpp engine (the offline model this package ships with). The
program's writer switch (``ProgramConfig.writer = "auto"``) picks the compact writer for it.

``takes_grammar``: the LM decodes under a grammar for the reply layout (the embedded engine with constraints on,
or an OpenAI-compatible llama.cpp server with ``server_grammar``), so a one-label choice can only be that label.
"""

from __future__ import annotations


def is_embedded(lm) -> bool:
    """Does ``lm`` run the embedded engine?"""
    from trace_dspy.lm.engine import LlamaEngine

    return isinstance(getattr(lm, "engine", None), LlamaEngine)


def takes_grammar(lm) -> bool:
    """Does ``lm`` enforce the reply layout with a grammar?"""
    from trace_dspy.lm.specs import GrammarLM

    if isinstance(lm, GrammarLM):
        return True
    return is_embedded(lm) and bool(lm.engine.constrained)
