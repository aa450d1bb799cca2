"""Show what a compiled artifact holds, or what changed between two of them.

    python -m trace_dspy.inspect trace-dspy@v1
    python -m trace_dspy.inspect trace-dspy@v1 trace-dspy@v2      # diff
    python -m trace_dspy.inspect --json champion

One reference prints the manifest (optimizer and its settings, dev scores
before and after, data, config, versions, git commit, MLflow run) and, per
stage, its instructions and number of demos. Two references print what the
second changed against the first: per stage, a unified diff of the
instructions and the change in demos; then the manifest fields that differ and
the dev scores side by side. Nothing is loaded but JSON; no model is built.

(Run as ``python -m trace_dspy.inspect``; inside the package the standard
library's ``inspect`` is still the one that ``import inspect`` finds, since the
package only uses absolute imports.)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from trace_dspy.core.console import out, out_json
from trace_dspy.store.errors import ArtifactError
from trace_dspy.store.inspection import (
    SCORE_KEYS,
    Artifact,
    diff,
    open_artifact,
    summary,
)

# ---------------------------------------------------------------- one artifact


def _settings(optimizer: dict[str, Any] | None) -> str:
    if not optimizer:
        return "none recorded"
    rest = ", ".join(f"{k}={v}" for k, v in optimizer.items() if k != "name")
    return f"{optimizer.get('name', '?')}" + (f" ({rest})" if rest else "")


def _num(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def _delta(a: Any, b: Any) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return f"{b - a:+.3f}" if max(abs(a), abs(b)) < 10 else f"{b - a:+.1f}"
    return ""


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  " + "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                              for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in [header, *rows]]
    lines.insert(1, "  " + "  ".join("-" * w for w in widths))
    return lines


def _models(config: dict[str, Any]) -> str:
    lm = config.get("lm") or {}
    default = (lm.get("default") or {}).get("model", "?")
    stages = {k: (v or {}).get("model") for k, v in (lm.get("stages") or {}).items()}
    extra = "".join(f", {k}: {v}" for k, v in stages.items())
    return f"{default}{extra}"


def _program_switches(program: dict[str, Any]) -> str:
    if not program:
        return "-"
    retrieval = program.get("retrieval") or {}
    writer = program.get("writer", "auto")
    parts = [f"writer {writer}" + (" (compact on the embedded model, standard on others)" if writer == "auto" else ""),
             f"adapter {program.get('adapter', 'auto')}",
             f"retrieval {'k=' + str(retrieval.get('k')) if retrieval.get('enabled') else 'off'}"]
    for key in ("reasoning", "disabled"):
        if program.get(key):
            parts.append(f"{key} {', '.join(program[key])}")
    if program.get("commonsense"):
        parts.append("commonsense")
    if program.get("reflection"):
        parts.append(f"reflection ({program.get('reflection_rounds')} rounds)")
    return ", ".join(parts)


def render_summary(art: Artifact) -> str:
    s = summary(art)
    scores = s["scores"]
    before, after = scores.get("dev_before") or {}, scores.get("dev_after") or {}
    data = s["data"]
    mlflow = s["mlflow"]
    rows = [
        ("path", s["path"]),
        ("created", s["created"]),
        ("optimizer", _settings(s["optimizer"])),
        ("metric", (s["metric"] or {}).get("name", "-")),
        ("data", f"{data.get('kind', '?')} {data.get('fingerprint', '')}".rstrip()
         + (f" ({data['train']} train, {data['dev']} dev)" if "train" in data and "dev" in data else "")),
        ("program", _program_switches((s["config"] or {}).get("program") or {})),
        *s["parts"].items(),
        ("models", _models(s["config"])),
        ("dspy", s["dspy"] or "-"),
        ("git commit", s["git_commit"] or "-"),
        ("mlflow run", (f"{mlflow['run_id']} (experiment {mlflow.get('experiment')}, registered as "
                        f"{mlflow.get('registered_model')}"
                        # manifests written before the save-first order also named the version
                        + (f" version {mlflow['registry_version']}" if mlflow.get("registry_version") else "")
                        + ")") if mlflow.get("run_id") else "-"),
        ("command", s["command"] or "-"),
    ]
    out = [f"{art.label}  ({art.ref})" if art.ref != art.label else art.label]
    out += [f"  {k:<11} {v}" for k, v in rows]
    if before or after:
        n = after.get("n", before.get("n"))
        out += ["", f"dev scores ({n} items)"]
        keys = [k for k in SCORE_KEYS if k in before or k in after]
        out += _table(["metric", "before", "after", "change"],
                      [[k, _num(before.get(k)), _num(after.get(k)), _delta(before.get(k), after.get(k))]
                       for k in keys])
    out += ["", "stages"]
    for name, stage in art.stages().items():
        n = len(stage["demos"])
        out.append(f"  {name}: {n} demo{'s' * (n != 1)}")
        out += [f"    {line}" for line in stage["instructions"].splitlines()]
    return "\n".join(out)


# ---------------------------------------------------------------- two artifacts


def _short(value: Any) -> str:
    if isinstance(value, list) and len(value) > 4:
        return f"[{len(value)} items]"
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."








def render_diff(a: Artifact, b: Artifact) -> str:
    d = diff(a, b)
    out = [f"{a.label} -> {b.label}", "", "stages"]
    for name, s in d["stages"].items():
        if "only_in" in s:
            out.append(f"  {name}: only in {s['only_in']}")
            continue
        na, nb = s["demos"]
        demos = f"demos {na} -> {nb}" if na != nb else f"demos {na}"
        churn = [f"{s['demos_new']} new"] * bool(s["demos_new"]) + [f"{s['demos_dropped']} dropped"] * bool(
            s["demos_dropped"])
        if churn:
            demos += f" ({', '.join(churn)})"
        what = ["instructions changed" if s["instructions_changed"] else "instructions unchanged", demos]
        if s["fields_changed"]:
            what.append("field descriptions changed")
        out.append(f"  {name}: {', '.join(what)}")
        out += [f"    {line}" for line in s["instructions_diff"].splitlines()]
    out += ["", "manifest"]
    if d["manifest"]:
        width = max(len(k) for k in d["manifest"])
        out += [f"  {k:<{width}}  {_short(va)} -> {_short(vb)}" for k, (va, vb) in d["manifest"].items()]
    else:
        out.append("  no differences besides version and creation time")
    after = d["scores"]["dev_after"]
    before = d["scores"]["dev_before"]
    keys = [k for k in SCORE_KEYS if k in after or k in before]
    if keys:
        out += ["", "dev scores (after compiling)" + ("" if d["same_dev_set"] else
                                                       "; the dev sets differ, so compare with care")]
        rows = []
        for k in keys:
            va, vb = after.get(k, [None, None])
            rows.append([k, _num(va), _num(vb), _delta(va, vb)])
        out += _table(["metric", a.label, b.label, "change"], rows)
    return "\n".join(out)


# ---------------------------------------------------------------- CLI


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from trace_dspy.cli.common import command_parser

    parser = command_parser("inspect", __doc__, prog)
    parser.add_argument("refs", nargs="+", metavar="REF",
                        help="an artifact: NAME@vN, NAME@latest, an artifact folder, a program.json, champion, "
                             "models:/NAME/VERSION, models:/NAME@ALIAS, runs:/RUN_ID; give two to diff them")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument("--artifacts-dir", help="where NAME@vN is looked up (default: $TRACE_DSPY_ARTIFACTS, "
                                                "else ./artifacts, then the checkout's)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI for champion/models:/runs:/ references")
    parser.add_argument("--allow-unverified-model", action="store_true",
                        help="show a champion/models:/runs:/ reference whose files have no sha256 record in the "
                             "store, unchecked, with a warning (without it, such a reference is refused)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    from trace_dspy.cli.common import fail, setup_logging

    args = build_parser(prog).parse_args(argv)
    if len(args.refs) > 2:
        return fail("give one reference to show, or two to diff")
    setup_logging(False)
    try:
        arts = [open_artifact(ref, root=args.artifacts_dir, tracking_uri=args.tracking_uri,
                              allow_unverified=args.allow_unverified_model) for ref in args.refs]
    except ArtifactError as exc:
        return fail(str(exc))
    try:
        if args.json:
            out_json(summary(arts[0]) if len(arts) == 1 else diff(*arts), indent=2)
        else:
            out(render_summary(arts[0]) if len(arts) == 1 else render_diff(*arts))
    except BrokenPipeError:  # e.g. piped into head
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
