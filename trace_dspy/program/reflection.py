"""Reflection: an audit of the finished pipeline, then a redo from the earliest faulty stage (bounded rounds).

``TraceProgram`` builds a ``Reflection`` when ``reflection`` is on in its config, with the two things it needs
from the program: how to run the audit stage, and how to run stages again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import dspy

from trace_dspy.core import spans
from trace_dspy.core.config import STAGES
from trace_dspy.core.dialogue import speaker_text


class Reflection:
    """The reflection loop: ``audit(state)`` runs the audit stage, whose outputs are ``audit_fields``;
    ``redo(stages, state, outputs)`` runs ``stages`` again on the pipeline's state; at most ``rounds`` rounds."""

    def __init__(self, rounds: int, audit: Callable[[dict], dspy.Prediction], audit_fields: Sequence[str],
                 redo: Callable[[list[str], dict, dict], None]):
        self.rounds = rounds
        self.audit = audit
        self.audit_fields = [f for f in audit_fields if f != "reasoning"]
        self.redo = redo

    def run(self, pipeline: list[str], state: dict, outputs: dict) -> list[dict]:
        """Audit, then redo the earliest faulty stage and everything after it; bounded rounds."""
        audits = []
        for round_ in range(1, self.rounds + 1):
            with spans.span(f"reflection round {round_}") as sp:
                redo = self._reflect_round(round_, pipeline, state, outputs, audits)
                sp.set_outputs(audits[-1])
            if redo is None:
                break
        state["revision_note"] = ""
        return audits

    def _reflect_round(self, round_: int, pipeline: list[str], state: dict, outputs: dict,
                       audits: list[dict]) -> str | None:
        """One audit; when it names a faulty stage, redo from there. Returns that stage (None: no redo)."""
        verdict = self.audit(state)
        audit = {k: verdict[k] for k in self.audit_fields}
        checks = self._rule_checks(state)
        audit.update(round=round_, rule_checks=checks)
        named = [verdict.faulty_stage] if verdict.faulty_stage != "none" else []
        named += [stage for stage, ok in (("analyze_cause", checks.get("spans_verbatim", True)),
                                          ("generate_response", checks["no_advice"])) if not ok]
        redo = self._earliest_enabled(named, pipeline)
        audit["redo_from"] = redo
        audits.append(audit)
        if redo is None:
            return None
        notes = [verdict.critique] + [f"Rule broken: {name}." for name, ok in checks.items() if not ok]
        state["revision_note"] = " ".join(n for n in notes if n)
        self.redo(pipeline[pipeline.index(redo):], state, outputs)
        return redo

    @staticmethod
    def _earliest_enabled(named: list[str], pipeline: list[str]) -> str | None:
        """The earliest named stage; a disabled one maps to the next stage that runs."""
        order = list(STAGES)
        candidates = []
        for stage in named:
            later = [s for s in pipeline if order.index(s) >= order.index(stage)]
            if later:
                candidates.append(later[0])
        return min(candidates, key=order.index) if candidates else None

    @staticmethod
    def _rule_checks(state: dict) -> dict[str, bool]:
        """What code can check without a model: quoted spans and advice."""
        from trace_dspy.optimize.scorers import gives_advice

        checks = {"no_advice": not gives_advice(state.get("response", ""))}
        if "trigger_spans" in state:
            spoken = " ".join(speaker_text(state["dialogue"]).split())
            checks["spans_verbatim"] = bool(state["trigger_spans"]) and all(
                " ".join(str(span).split()) in spoken for span in state["trigger_spans"])
        return checks
