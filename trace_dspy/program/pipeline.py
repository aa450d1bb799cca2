"""TraceProgram: the TRACE pipeline as one DSPy module.

recognize_emotion -> analyze_cause -> plan_strategy -> generate_response

Each stage is a single ``dspy.Predict`` stored under the stage's name. Step by
step reasoning is a ``reasoning`` output field added to the stage signature
(what ``dspy.ChainOfThought`` does internally), so that switching it on or off
never renames a predictor: the four names are the compiled artifact's schema.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import dspy

from trace_dspy.core import spans
from trace_dspy.core.config import STAGES, ProgramConfig
from trace_dspy.core.dialogue import normalize_dialogue
from trace_dspy.core.labels import ekman_group
from trace_dspy.core.stages import BY_NAME, REGISTRY
from trace_dspy.program.lm_warnings import quiet_truncation
from trace_dspy.program.parts import FittedParts
from trace_dspy.program.reflection import Reflection
from trace_dspy.optimize.selection import MetricCache
from trace_dspy.program.writers import Writer, writer_for
from trace_dspy.signatures import OPTIONAL_SIGNATURES, STAGE_SIGNATURES

ALL_SIGNATURES = {**STAGE_SIGNATURES, **OPTIONAL_SIGNATURES}

# Inputs that exist only when the stage producing them runs.
_PRODUCED_BY = {s.name: s.gates for s in REGISTRY if s.gates}
_REASONING_DESC = "Think it through step by step, briefly, before answering."
_COMMONSENSE_DESC = "Commonsense inferences about the speaker (intent, need, want, effect, reaction)."
_CANDIDATES_DESC = ("The emotions a classifier fitted on past conversations finds most likely, with their "
                    "probabilities; usually one of them is right. Empty when no classifier is available.")
_NOTE_DESC = "An audit's note on an earlier attempt at this stage; empty on the first attempt."
_ATOMIC = (("x_intent", "xIntent"), ("x_need", "xNeed"), ("x_want", "xWant"), ("x_effect", "xEffect"),
           ("x_react", "xReact"))


@dataclass(frozen=True)
class EmotionPath:
    """Which way the emotion is decided: ``route`` is ``prior`` (the prior's one label, no LM call),
    ``prior+lm`` (the LM chooses, offered the prior's top ``k``) or ``lm``; ``reason`` says why (for ``lm``)."""

    route: str
    k: int = 0
    reason: str = ""

    def __str__(self) -> str:
        if self.route == "prior":
            return "prior (top 1; a constrained LM could only repeat it, so it is not asked)"
        if self.route == "prior+lm":
            return f"prior+lm (top {self.k})"
        return f"lm ({self.reason})"


def stage_signature(stage: str, config: ProgramConfig) -> type[dspy.Signature]:
    """The signature a stage uses under ``config``."""
    sig = ALL_SIGNATURES[stage]
    for producer, names in _PRODUCED_BY.items():
        if not config.enabled(producer):
            for name in names:
                if name in sig.input_fields:
                    sig = sig.delete(name)
    if stage == "recognize_emotion" and config.prior_k != 0:
        sig = sig.append("emotion_candidates", dspy.InputField(desc=_CANDIDATES_DESC), type_=str)
    if stage == "analyze_cause" and config.commonsense:
        sig = sig.append("commonsense", dspy.InputField(desc=_COMMONSENSE_DESC), type_=str)
    if config.reflection and stage != "reflect":
        sig = sig.append("revision_note", dspy.InputField(desc=_NOTE_DESC), type_=str)
    if config.reasons(stage):
        sig = sig.prepend("reasoning", dspy.OutputField(desc=_REASONING_DESC), type_=str)
    return sig


class TraceProgram(dspy.Module):
    """Emotion -> cause -> strategy -> reply, one typed predictor per stage.

    Call it with ``dialogue`` (a list of turns, or a string with one
    ``Speaker:``/``Listener:`` line per turn, ending on the speaker) and
    optionally ``exemplars`` (a list of formatted example conversations).
    It returns a ``dspy.Prediction`` holding every stage's outputs.

    ``stage_lms`` maps stage names to the ``dspy.LM`` that runs them; stages
    without one use the LM in ``dspy.settings``. With ``stage_lms_default``
    they are only a default: while an LM is configured (``dspy.configure`` or
    ``dspy.context``), every stage runs on that one instead. They are applied with
    ``dspy.context`` inside ``forward`` rather than stored on the predictors,
    because optimizers reset predictor LMs when they compile.

    How the reply is written is the writer's (``config.writer``, see
    ``trace_dspy.program.writers``): TRACE as published, or the compact writer
    for a small model. With ``reflection`` on, a ``Reflection`` audits the
    finished pipeline and redoes stages.
    """

    def __init__(self, config: ProgramConfig | None = None, stage_lms: Mapping[str, dspy.LM] | None = None,
                 retriever=None, emotion_prior=None, *, parts: FittedParts | None = None,
                 stage_lms_default: bool = False):
        super().__init__()
        self.config = config or ProgramConfig()
        self._prior_encoder = None
        # Best-of-N reply reward: None = the writer's (the default metric's reference-free score).
        self.reward_fn = None
        self.reward_metrics = MetricCache()  # the reward metrics built so far, shared by copies
        # The openings of the replies kept lately, which the compact writer varies against; kept only after
        # remember_openings (respond and chat), not in evaluations and compiles.
        self.keeps_openings = False
        self.recent_openings = None
        self._situations: dict[str, float | None] = {}  # situation_pleasant, per dialogue
        self._situation_lock = threading.Lock()
        for stage in STAGES:
            predictor = dspy.Predict(stage_signature(stage, self.config)) if self.config.enabled(stage) else None
            setattr(self, stage, predictor)
        # What a compile fitted (trace_dspy.program.parts): the exemplar index, the emotion prior, the scaffolded
        # reply's openers and the further reply plans. ``retriever`` and ``emotion_prior`` are shorthands.
        shorthand = {k: v for k, v in (("retriever", retriever), ("emotion_prior", emotion_prior)) if v is not None}
        if "retriever" in shorthand:
            shorthand["retrieval"] = shorthand.pop("retriever")
        self._use_parts((parts or FittedParts()).replace(**shorthand) if shorthand else parts or FittedParts())
        self._stage_lms: dict[str, dspy.LM] = {}
        self._stage_lms_default = stage_lms_default
        self.set_stage_lms(stage_lms or {})

    @property
    def parts(self) -> FittedParts:
        """The fitted parts this program was built with."""
        return self._parts

    def _use_parts(self, parts: FittedParts) -> None:
        """Take ``parts``: the emotion stage has the candidates field only with a prior (so a program without one
        sends the prompt it always did)."""
        self._parts = parts
        self._situations = {}  # another prior reads situations anew
        predictor = getattr(self, "recognize_emotion", None)
        if predictor is not None:
            want = self.config.prior_k != 0 and parts["emotion_prior"] is not None
            has = "emotion_candidates" in predictor.signature.input_fields
            if want and not has:
                predictor.signature = predictor.signature.append(
                    "emotion_candidates", dspy.InputField(desc=_CANDIDATES_DESC), type_=str)
            elif has and not want:
                predictor.signature = predictor.signature.delete("emotion_candidates")

    def remember_openings(self, size: int | None = None) -> TraceProgram:
        """Keep the openings of the replies this program writes from now on (the last ``size``; None: the
        writer's default), so that the compact writer prefers a reply that does not open as the recent ones
        did (``variety_penalty``); returns the program."""
        self.keeps_openings = size or True
        self.recent_openings = None
        return self

    def with_parts(self, **values) -> TraceProgram:
        """A copy of this program (demos, instructions, LMs) with some fitted parts replaced."""
        new = self.deepcopy()
        new._use_parts(self._parts.replace(**values))
        return new

    @property
    def retriever(self):
        """The exemplar index (``ExemplarIndex``); None: exemplars only when passed in."""
        return self._parts["retrieval"]

    @property
    def emotion_prior(self):
        """The emotion classifier (``EmotionPrior``) that offers the emotion stage its top-k labels; or None."""
        return self._parts["emotion_prior"]

    @emotion_prior.setter
    def emotion_prior(self, prior) -> None:
        self._use_parts(self._parts.replace(emotion_prior=prior))

    @property
    def reply_openers(self):
        """The scaffolded reply's fitted openers (valence -> mechanism -> openers); None: the stock openers."""
        return self._parts["reply_openers"]

    @reply_openers.setter
    def reply_openers(self, openers) -> None:
        self._use_parts(self._parts.replace(reply_openers=openers))

    @property
    def reply_plans(self) -> tuple[tuple[str, str], ...]:
        """Further (primary, secondary) plans a reply is written for; the best reply by reward is kept."""
        return self._parts["reply_plans"]

    @reply_plans.setter
    def reply_plans(self, plans) -> None:
        self._use_parts(self._parts.replace(reply_plans=plans))

    @property
    def first_plan(self) -> tuple[str, str] | None:
        """The plan a constrained LM's reply race starts from in place of a planner call (see ``planner_path``)."""
        return self._parts["first_plan"]

    @first_plan.setter
    def first_plan(self, plan) -> None:
        self._use_parts(self._parts.replace(first_plan=plan))

    def race_plans(self) -> tuple[tuple[str, str], ...]:
        """The fitted plans a reply is written for besides the planner's: the first plan, then the further ones.
        Where the first plan replaces the planner call it is the planner's plan, and is written for once."""
        first = self.first_plan
        return tuple(dict.fromkeys([*([first] if first else []), *self.reply_plans]))

    def writer(self, lm=None) -> Writer:
        """The writer for the reply stage on ``lm`` (default: the LM it runs on now); see ``config.writer``."""
        return writer_for(self.config, lm if lm is not None else self.lm_for("generate_response"))

    def planner_path(self, lm=None) -> str:
        """Which way the plan is decided: ``fitted`` (``first_plan``, no LM call; the compact writer's) or ``lm``."""
        predictor = getattr(self, "plan_strategy", None)
        return "fitted" if self.writer(lm).plan_fitted(self.first_plan, predictor) else "lm"

    def set_stage_lms(self, stage_lms: Mapping[str, dspy.LM]) -> TraceProgram:
        unknown = set(stage_lms) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stage(s) for stage_lms: {', '.join(sorted(unknown))}")
        self._stage_lms = dict(stage_lms)
        return self

    @property
    def stage_lms(self) -> dict[str, dspy.LM]:
        return dict(self._stage_lms)

    def _stage_lm(self, stage: str):
        """The stage's own LM; None where it has none, or where its LMs are a default and one is configured."""
        if self._stage_lms_default and dspy.settings.lm is not None:
            return None
        return self._stage_lms.get(stage)

    def _stage_context(self, stage: str, writer: Writer | None = None):
        """The stage's LM (its own, where it has one; a fine-tuned writer's adapted LM for the reply stage, see
        ``Writer.stage_lm``) and the adapter its writer lays it out with."""
        writer = writer or self.writer()
        lm = writer.stage_lm(self, stage) or self._stage_lm(stage)
        adapter = writer.adapter(stage)
        overrides = {k: v for k, v in (("lm", lm), ("adapter", adapter)) if v is not None}
        return dspy.context(**overrides) if overrides else nullcontext()

    def reply_format(self, lm=None) -> str:
        """The reply stage's layout (``fields`` for the standard writer; the compact writer's choice else)."""
        return self.writer(lm).reply_format()

    def best_of(self, lm=None) -> int:
        """How many reply candidates the writer may write (``auto`` resolved by the writer)."""
        return self.writer(lm).best_of()

    def reply_reward(self, inputs: dict, pred) -> float:
        """The writer's reference-free score of a reply candidate for the reply stage's ``inputs``: no gold
        reply, no LM call (``reward_fn`` where set)."""
        return self.writer().reward(self, inputs, pred)

    def __deepcopy__(self, memo):
        # Optimizers deep-copy programs (student, teacher, candidates). The copies
        # share the stage LMs: an LM is a connection, not program state.
        # The reward metrics are a cache (keyed by the demo replies they guard against) holding scorers and a lock.
        for shared in (*self._stage_lms.values(), self._parts, self._prior_encoder, self.reward_fn,
                       self.reward_metrics):
            if shared is not None:
                memo[id(shared)] = shared
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            setattr(new, key, copy.deepcopy(value, memo) if key not in _FRESH_IN_COPIES else _FRESH_IN_COPIES[key]())
        return new

    def deepcopy(self):
        """DSPy's copy (``reset_copy``, optimizers), through ``__deepcopy__``: the shared parts stay shared.

        DSPy's own ``Module.deepcopy`` tries to deep-copy every attribute and
        warns for each one that cannot be (the retriever, the encoder).
        """
        return copy.deepcopy(self)

    def retrieve(self, dialogue: str, emotion: str | None, *, last_turn: bool = False) -> list[str]:
        """Exemplars for a dialogue from the retriever (empty without one). With ``last_turn``, each is cut to
        the speaker's last turn and the reply: what the chat and scaffold reply layouts show anyway."""
        if self.retriever is None:
            return []
        from trace_dspy.data.retrieval import format_exemplar

        cfg = self.config.retrieval
        hits = self.retriever.search(dialogue, emotion=emotion, k=cfg.k, filter_by_group=cfg.filter_by_group)
        return [format_exemplar(_last_exchange(h) if last_turn else h) for h in hits]

    def prior_k(self, lm=None) -> int:
        """Candidates the prior offers (``auto`` resolved by the writer: 1 for the compact writer, 5 else)."""
        return self.writer(lm).prior_k()

    def lm_for(self, stage: str):
        """The LM ``stage`` runs on now: its own (see ``_stage_lm``), else the one DSPy holds; None: neither."""
        return self._stage_lm(stage) or dspy.settings.lm

    def emotion_path(self, lm=None) -> EmotionPath:
        """Which way the emotion is decided, and why the prior is not used where it is not."""
        if self.config.prior_k == 0:
            return EmotionPath("lm", reason="prior off: prior_k = 0")
        if self.emotion_prior is None:
            return EmotionPath("lm", reason="this program has no fitted emotion prior")
        try:
            self._encoder()
        except Exception as exc:  # PriorError: the embed extra is missing
            return EmotionPath("lm", reason=str(exc))
        writer = self.writer()
        emotion_lm = lm if lm is not None else self.lm_for("recognize_emotion")
        if writer.prior_decides(emotion_lm, self.recognize_emotion):
            return EmotionPath("prior", k=1)
        return EmotionPath("prior+lm", k=writer.prior_k())

    def _encoder(self):
        if self._prior_encoder is None:
            from trace_dspy.program.emotion_prior import default_encoder

            self._prior_encoder = default_encoder()
        return self._prior_encoder

    def emotion_candidates(self, dialogue: str) -> tuple[list[tuple[str, float]], EmotionPath]:
        """The prior's candidates with their probabilities (none without a usable prior) and the path taken."""
        path = self.emotion_path()
        if path.route == "lm":
            return [], path
        return self.emotion_prior.candidates(dialogue, path.k, self._encoder()), path

    def prior_candidates(self, dialogue, k: int) -> list[tuple[str, float]] | None:
        """The fitted prior's ``k`` most likely labels for ``dialogue``, with their probabilities, whatever the
        LM and ``prior_k``; None without a usable prior (none attached, or its encoder cannot load)."""
        if self.emotion_prior is None:
            return None
        try:
            encoder = self._encoder()
        except Exception:  # noqa: BLE001 - PriorError: the embed extra is missing (emotion_path says so)
            return None
        return self.emotion_prior.candidates(normalize_dialogue(dialogue), k, encoder)

    def situation_pleasant(self, dialogue) -> float | None:
        """How likely the speaker's situation is a pleasant one: the fitted prior's probability mass on the
        pleasant emotions, plus half its mass on those that go either way (``trace_dspy.optimize.tone``;
        None without a usable prior). Remembered per dialogue:
        the reply reward asks for it once per candidate."""
        from trace_dspy.core.labels import EMOTIONS
        from trace_dspy.optimize.tone import situation_pleasantness

        key = str(dialogue)
        with self._situation_lock:
            if key in self._situations:
                return self._situations[key]
        value = situation_pleasantness(self.prior_candidates(dialogue, len(EMOTIONS)))
        with self._situation_lock:
            if len(self._situations) >= 256:
                self._situations.clear()
            self._situations[key] = value
        return value

    def recognize(self, dialogue) -> dspy.Prediction:
        """Only the emotion part of ``forward``: the prior's candidates and the ``recognize_emotion`` stage, run
        by the same code as in ``forward``; no later stage runs.

        Returns emotion, emotion_group, emotion_path and emotion_candidates (empty when the prior offered
        none). Where the prior decides (one candidate on a grammar-constrained LM), no LM call is made.
        """
        with quiet_truncation(), spans.span("trace_dspy emotion", inputs={"dialogue": dialogue}) as root:
            state, outputs = self._recognize(dialogue, None)
            outputs.setdefault("emotion_candidates", "")
            outputs["emotion_group"] = ekman_group(outputs["emotion"])
            root.set_outputs({k: outputs[k] for k in ("emotion", "emotion_group", "emotion_path")})
        return dspy.Prediction(dialogue=state["dialogue"], **outputs)

    def forward(self, dialogue, exemplars: Sequence[str] | None = None) -> dspy.Prediction:
        with quiet_truncation(), spans.span("trace_dspy", inputs={"dialogue": dialogue}) as root:
            pred = self._forward(dialogue, exemplars)
            root.set_outputs({k: pred.get(k) for k in ("emotion", "emotion_group", "cause_summary", "strategy",
                                                        "response")})
        return pred

    def _forward(self, dialogue, exemplars: Sequence[str] | None) -> dspy.Prediction:
        state, outputs = self._recognize(dialogue, exemplars)
        retrieve = exemplars is None and self.retriever is not None and self.config.retrieval.enabled
        pipeline = [s for s in self.config.pipeline() if s != "reflect"]
        self._run_stages([s for s in pipeline if s != "recognize_emotion"], state, outputs, retrieve)
        if self.config.reflection:
            reflection = Reflection(self.config.reflection_rounds, audit=lambda st: self._call("reflect", st),
                                    audit_fields=list(self.reflect.signature.output_fields),
                                    redo=lambda stages, st, out: self._run_stages(stages, st, out, retrieve=False))
            outputs["audits"] = reflection.run(pipeline, state, outputs)
        for key in ("reply_rewards", "plan_path"):
            if key in state:
                outputs[key] = state[key]
        outputs["emotion_group"] = ekman_group(outputs["emotion"])
        outputs["writer"] = self.writer().name
        return dspy.Prediction(dialogue=state["dialogue"], exemplars=state["exemplars"], **outputs)

    def _recognize(self, dialogue, exemplars: Sequence[str] | None) -> tuple[dict, dict]:
        """The pipeline's start, shared by ``forward`` and ``recognize``: the prior's candidates (its span),
        then the ``recognize_emotion`` stage. Returns the pipeline state and the outputs so far."""
        state: dict = {"dialogue": normalize_dialogue(dialogue), "exemplars": list(exemplars or []),
                       "revision_note": ""}
        outputs: dict = {}
        with spans.span("emotion prior", inputs={"dialogue": state["dialogue"]}) as sp:
            candidates, path = self.emotion_candidates(state["dialogue"])
            outputs["emotion_path"] = str(path)
            state["emotion_candidates"] = ""
            if candidates:
                from trace_dspy.program.emotion_prior import format_candidates

                state["emotion_candidates"] = format_candidates(candidates)
            if path.route == "prior":  # the emotion stage takes it without an LM call
                state["prior_label"] = candidates[0][0]
            sp.set_outputs({"candidates": state["emotion_candidates"], "path": outputs["emotion_path"]})
        if state["emotion_candidates"]:
            outputs["emotion_candidates"] = state["emotion_candidates"]
        self._run_stages(["recognize_emotion"], state, outputs, retrieve=False)  # retrieval waits for the plan
        return state, outputs

    def _run_stages(self, stages: Sequence[str], state: dict, outputs: dict, retrieve: bool) -> None:
        for stage in stages:
            if stage == "plan_strategy" and retrieve:
                self._retrieve_into(state)  # after the emotion is known: TRACE filters exemplars by its group
                retrieve = False
            predictor = getattr(self, stage)
            with spans.span(BY_NAME[stage].span or stage) as sp:
                result = self._call(stage, state)
                sp.set_inputs({n: state.get(n) for n in predictor.signature.input_fields})
                sp.set_outputs({n: result[n] for n in predictor.signature.output_fields})
            for name in predictor.signature.output_fields:
                if name == "reasoning":
                    outputs[f"{stage}_reasoning"] = result[name]
                else:
                    state[name] = outputs[name] = result[name]
            if "plan_choice" in state:  # the reply race kept a further plan's reply: its plan is the program's
                outputs.update({k: state[k] for k in ("strategy", "secondary_strategy") if k in state})
                outputs["reply_plans"] = state.pop("plan_choice")
            if stage == "infer_commonsense":
                state["commonsense"] = "; ".join(f"{label}: {result[key]}" for key, label in _ATOMIC)

    def _retrieve_into(self, state: dict) -> None:
        """The exemplars for the dialogue and its emotion, into ``state`` (the compact writer cuts each to its
        last exchange: the planner's prompt is the longest the program reads per dialogue)."""
        with spans.span("retrieval", span_type="RETRIEVER",
                        inputs={"dialogue": state["dialogue"], "emotion": state.get("emotion")}) as sp:
            state["exemplars"] = self.retrieve(state["dialogue"], state.get("emotion"),
                                               last_turn=self.writer().exemplars_last_turn)
            sp.set_outputs(state["exemplars"])

    def _call(self, stage: str, state: dict):
        predictor = getattr(self, stage)
        inputs = {name: state[name] for name in predictor.signature.input_fields}
        if stage == "recognize_emotion" and state.get("prior_label"):
            return dspy.Prediction(emotion=state["prior_label"])
        writer = self.writer()
        if stage == "plan_strategy":
            state["plan_path"] = "fitted" if writer.plan_fitted(self.first_plan, predictor) else "lm"
            if state["plan_path"] == "fitted":  # the compile found the planner call did not pay
                return dspy.Prediction(strategy=self.first_plan[0], secondary_strategy=self.first_plan[1])
        with self._stage_context(stage, writer):
            if stage == "generate_response":
                return writer.write_reply(self, predictor, inputs, state)
            return predictor(**inputs)


# What a copy starts afresh: no history of openings (a copy has written nothing yet), the per-dialogue memory of
# situation_pleasant (a copy may get another prior) and its lock.
_FRESH_IN_COPIES = {"keeps_openings": lambda: False, "recent_openings": lambda: None, "_situations": dict,
                    "_situation_lock": threading.Lock}


def _last_exchange(hit):
    """An exemplar hit cut to the speaker's last turn (the reply follows it)."""
    from trace_dspy.core.dialogue import SPEAKER, last_speaker_turn

    try:
        said = last_speaker_turn(hit["dialogue"])
    except ValueError:
        return hit
    return {**hit, "dialogue": f"{SPEAKER}: {said}"} if said else hit
