"""``python -m trace_dspy.bench``: a launcher only; the command is :mod:`trace_dspy.cli.bench`."""

if __name__ == "__main__":
    from trace_dspy.cli.bench import main

    raise SystemExit(main())
