from pathlib import Path
import json
from trace_dspy.program.emotion_prior import PriorError, SHIPPED, fit_from_source



def main(argv: list[str] | None = None) -> int:
    """Refit the shipped prior (or write one elsewhere) from an ED folder's pool."""
    import argparse
    import sys

    from trace_dspy.data.sources import DataError, resolve_source

    parser = argparse.ArgumentParser(prog="python -m trace_dspy.program.emotion_prior",
                                     description="fit the emotion prior on a data source's pool (never its test split)")
    parser.add_argument("--data", required=True, help="an ED folder (valid.csv, test.csv) or another data source")
    parser.add_argument("--seed", type=int, default=0, help="the train/dev split seed (default 0)")
    parser.add_argument("--output", type=Path, default=SHIPPED, help=f"where to write it (default {SHIPPED})")
    args = parser.parse_args(argv)
    try:
        source = resolve_source(args.data, seed=args.seed)
        prior = fit_from_source(source, seed=args.seed)
    except (DataError, PriorError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    prior.save(args.output)
    print(json.dumps({"output": str(args.output), **prior.describe()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
