"""``python -m trace_dspy.bench_local``: a launcher only; the command is :mod:`trace_dspy.cli.bench_local`."""

if __name__ == "__main__":
    from trace_dspy.cli.bench_local import main

    raise SystemExit(main())
