"""The quality bench: every system on the same test items, paired-bootstrap intervals against the first,
charts, and the MLflow runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy

from trace_dspy.bench.records import BENCH_EXPERIMENT
from trace_dspy.bench.systems import System
from trace_dspy.core.pricing import COST_KEY, DIALOGUES, Pricing
from trace_dspy.core.tables import markdown_table
from trace_dspy.optimize.metric import COST_KEYS, DETAIL_KEYS, PAIRED_KEYS, SUMMARY_KEYS

# Per-example values that get paired-bootstrap intervals against the baseline: the summary's PAIRED_KEYS, where
# an accuracy is, per example, whether the label was right.
_PER_EXAMPLE = {"emotion_acc": "emotion_correct", "group_acc": "group_correct"}
PAIRED_METRICS = tuple(_PER_EXAMPLE.get(k, k) for k in PAIRED_KEYS)
# The scores table; the cost table shows COST_KEYS.
SCORE_KEYS = tuple(k for k in SUMMARY_KEYS if k not in DETAIL_KEYS and k not in COST_KEYS)
# The single-call baseline that hosted-LM costs are set beside, when a bench compares it.
SINGLE_CALL = "single_cot"


def per_example(row: dict[str, Any]) -> dict[str, float]:
    """The per-example values that paired intervals are computed on (failed rows count 0)."""
    from trace_dspy.core.labels import ekman_group
    from trace_dspy.optimize.scorers import rouge_l, token_f1
    from trace_dspy.workflows.evaluation import tone_on_side

    pred = row.get("prediction") or {}
    comps = row.get("components") or {}
    gold, guess = row.get("gold_emotion"), pred.get("emotion")
    reply, ref = pred.get("response") or "", row.get("gold_response") or ""
    failed = "error" in row

    def comp(name: str) -> float:
        value = comps.get(name)
        return 0.0 if failed or value is None else float(value)

    return {
        "empathy": float(row.get("score", 0.0)),
        "empathy_learned": comp("empathy"),
        "strategy_fit": comp("strategy_fit"),
        "emotion_correct": float(not failed and guess is not None and guess == gold),
        "group_correct": float(not failed and guess is not None and ekman_group(guess) == ekman_group(gold)),
        "emotion": comp("emotion"),
        "rules": comp("rules"),
        "similarity": comp("similarity"),
        "relevance": comp("relevance"),
        "token_f1": token_f1(ref, reply) if ref and not failed else 0.0,
        "rouge_l": rouge_l(ref, reply) if ref and not failed else 0.0,
        "tone_agreement": 0.0 if failed else (tone_on_side(row) or 0.0),
    }


@dataclass
class QualityReport:
    systems: list[str]
    descriptions: dict[str, str]
    summaries: dict[str, dict[str, Any]]
    paired: dict[str, dict[str, tuple[float, float, float]]]  # system -> metric -> (diff, low, high)
    score_ci: dict[str, tuple[float, float, float]]  # system -> empathy (mean, low, high)
    compile: dict[str, dict[str, Any]]
    run: dict[str, Any] = field(default_factory=dict)
    pricing: Pricing | None = None  # the prices behind each summary's cost per 1,000 dialogues

    @property
    def baseline(self) -> str:
        return self.systems[0]

    def to_dict(self) -> dict[str, Any]:
        summaries = {k: {m: v for m, v in s.items() if m != "distributions"} for k, s in self.summaries.items()}
        out = {"run": self.run, "systems": self.systems, "baseline": self.baseline, "descriptions": self.descriptions,
               "summaries": summaries,
               "paired_vs_baseline": {k: {m: list(v) for m, v in d.items()} for k, d in self.paired.items()},
               "empathy_ci": {k: list(v) for k, v in self.score_ci.items()}, "compile": self.compile}
        if self.pricing is not None:
            out["hosted_cost"] = {"pricing": self.pricing.to_dict(),
                                  COST_KEY: {n: self.summaries[n].get(COST_KEY) for n in self.systems},
                                  **({f"times_{SINGLE_CALL}": self.times_single_call()}
                                     if SINGLE_CALL in self.systems else {})}
        return out

    def times_single_call(self) -> dict[str, float | None]:
        """Each system's hosted cost as a multiple of the single-call baseline's (None where either is unknown)."""
        base = self.summaries[SINGLE_CALL].get(COST_KEY)
        costs = {n: self.summaries[n].get(COST_KEY) for n in self.systems}
        return {n: c / base if c is not None and base else None for n, c in costs.items()}

    def markdown(self) -> str:
        def cell(value):
            return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)

        names = self.systems
        scores = markdown_table(["metric", *names], [
            [k, *(cell(self.summaries[n].get(k)) for n in names)]
            for k in SCORE_KEYS if any(k in self.summaries[n] for n in names)])
        others = names[1:]
        paired = markdown_table(["metric", *others], [
            [metric, *("{:+.4f} [{:+.4f}, {:+.4f}]".format(*self.paired[n][metric]) for n in others)]
            for metric in PAIRED_METRICS])
        cost_rows = [[k.replace("_per_dialogue", ""), *(cell(self.summaries[n].get(k)) for n in names)]
                     for k in COST_KEYS if any(k in self.summaries[n] for n in names)]
        if self.pricing is not None and SINGLE_CALL in names:
            times = self.times_single_call()
            cost_rows.append([f"cost vs {SINGLE_CALL}",
                              *("-" if times[n] is None else f"{times[n]:.2f}x" for n in names)])
        cost = markdown_table(["metric", *names], cost_rows)
        priced = (f"; {COST_KEY} in USD for {DIALOGUES:,} dialogues at {self.pricing.describe()}"
                  if self.pricing is not None else "")
        compiled = [f"- `{n}`: compiled in {c['seconds']:.0f} s with {c['lm_calls']} LM calls"
                    for n, c in self.compile.items()]
        systems = [f"- `{n}`: {self.descriptions[n]}" for n in names]
        parts = ["Systems:", *systems, "", "Scores (per system):", "", scores, "",
                 f"Paired difference against `{self.baseline}`, mean [95% bootstrap CI]:", "", paired, "",
                 f"Cost per dialogue (LM calls that reached the model, tokens, wall seconds){priced}:", "", cost]
        if compiled:
            parts += ["", "Compile cost:", "", *compiled]
        return "\n".join(parts)


def program_fingerprint(program) -> str | None:
    """A TraceProgram's prompts, demos, config and runtime parts as one string; None for other programs."""
    import json

    from trace_dspy.program.pipeline import TraceProgram

    if not isinstance(program, TraceProgram):
        return None
    parts = {"state": program.dump_state(), "config": program.config.to_dict(),
             "retriever": getattr(program.retriever, "fingerprint", None),
             "prior": id(program.emotion_prior) if program.emotion_prior is not None else None,
             "openers": program.reply_openers, "plans": program.reply_plans,
             "lms": sorted((stage, id(lm)) for stage, lm in program.stage_lms.items())}
    return json.dumps(parts, sort_keys=True, default=str)


def run_quality(systems: Sequence[System], examples: Sequence[dspy.Example], metric, *, lm=None, threads: int = 1,
                rows_dir: str | Path | None = None, max_failure_rate: float | None = 0.5, seed: int = 0,
                run: dict[str, Any] | None = None, pricing: Pricing | None = None) -> QualityReport:
    """Evaluate every system on the same examples; intervals are against ``systems[0]``; with ``pricing``,
    each summary says what 1,000 dialogues would cost on a hosted LM."""
    from trace_dspy.optimize.scorers import paired_bootstrap_ci
    from trace_dspy.workflows.evaluation import evaluate_program

    if not examples:
        raise ValueError("no examples to benchmark on")
    summaries, values = {}, {}
    evaluated: dict[str, str] = {}  # program fingerprint -> the system evaluated with it
    for system in systems:
        key = program_fingerprint(system.program)
        if key is not None and key in evaluated:
            # The same program on the same LMs (e.g. ``select`` kept the uncompiled candidate): one evaluation.
            twin = evaluated[key]
            summaries[system.name] = {**summaries[twin], "same_program_as": twin}
            values[system.name] = values[twin]
            continue
        if key is not None:
            evaluated[key] = system.name
        path = Path(rows_dir) / f"{system.name.replace(':', '_').replace('/', '_')}.jsonl" if rows_dir else None
        result = evaluate_program(system.program, examples, metric, lm=lm, threads=threads, results_path=path,
                                  max_failure_rate=max_failure_rate, desc=system.name, pricing=pricing)
        summaries[system.name] = result.summary
        values[system.name] = [per_example(r) for r in result.rows]
    base = systems[0].name
    paired, score_ci = {}, {}
    for system in systems:
        mine = values[system.name]
        paired[system.name] = {
            m: paired_bootstrap_ci([v[m] for v in mine], [v[m] for v in values[base]], seed=seed)
            for m in PAIRED_METRICS}
        scores = [v["empathy"] for v in mine]
        score_ci[system.name] = paired_bootstrap_ci(scores, [0.0] * len(scores), seed=seed)
    compile_costs = {s.name: {"seconds": s.compile_seconds, "lm_calls": s.compile_lm_calls}
                     for s in systems if s.compile_seconds is not None}
    return QualityReport([s.name for s in systems], {s.name: s.description for s in systems}, summaries, paired,
                         score_ci, compile_costs, dict(run or {}), pricing)


def quality_charts(report: QualityReport, out_dir: str | Path) -> list[Path]:
    """Two PNGs: empathy by system (with 95% CIs) and tokens per dialogue against empathy."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = report.systems
    means = [report.score_ci[n][0] for n in names]
    lows = [report.score_ci[n][0] - report.score_ci[n][1] for n in names]
    highs = [report.score_ci[n][2] - report.score_ci[n][0] for n in names]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(names)), 3.6))
    ax.bar(range(len(names)), means, yerr=[lows, highs], capsize=4, color="#4c72b0")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel("empathy score (95% CI)")
    ax.set_title(f"Empathy by system (n={report.summaries[names[0]]['n']})")
    fig.tight_layout()
    score_png = out / "bench_score.png"
    fig.savefig(score_png, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for n in names:
        s = report.summaries[n]
        tokens = s.get("prompt_tokens_per_dialogue", 0) + s.get("completion_tokens_per_dialogue", 0)
        ax.scatter([tokens], [s["empathy"]], s=40)
        ax.annotate(n, (tokens, s["empathy"]), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("tokens per dialogue (prompt + completion)")
    ax.set_ylabel("empathy score")
    ax.set_title("Cost against quality")
    fig.tight_layout()
    cost_png = out / "bench_tokens_vs_score.png"
    fig.savefig(cost_png, dpi=120)
    plt.close(fig)
    return [score_png, cost_png]


def log_quality_to_mlflow(report: QualityReport, files: Sequence[Path], *, tracking_uri=None,
                          experiment: str = BENCH_EXPERIMENT, params: dict | None = None) -> str:
    """One parent run with the table and charts; one nested run per system (compare them in the UI)."""
    import mlflow

    from trace_dspy.store.tracking import log_params, mlflow_run, numeric_metrics

    with mlflow_run(tracking_uri=tracking_uri, experiment=experiment, run_name="bench quality",
                    tags={"trace_dspy.kind": "bench-quality"}) as parent:
        log_params({**(params or {}), "systems": ",".join(report.systems), "baseline": report.baseline,
                    **({"pricing": report.pricing.to_dict()} if report.pricing is not None else {})})
        for name in report.systems:
            with mlflow_run(tracking_uri=tracking_uri, experiment=experiment, run_name=name, nested=True,
                            tags={"trace_dspy.kind": "bench-system", "trace_dspy.system": name}):
                log_params({"system": name, "description": report.descriptions[name]})
                metrics = numeric_metrics(report.summaries[name], "test")
                for metric, (diff, low, high) in report.paired[name].items():
                    metrics.update({f"vs_baseline/{metric}": diff, f"vs_baseline/{metric}_ci_low": low,
                                    f"vs_baseline/{metric}_ci_high": high})
                if name in report.compile:
                    metrics.update(numeric_metrics(report.compile[name], "compile"))
                mlflow.log_metrics(metrics)
        for path in files:
            mlflow.log_artifact(str(path))
        return parent.info.run_id


# ----------------------------------------------------------------------------- overhead
