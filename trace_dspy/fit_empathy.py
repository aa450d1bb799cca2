"""``python -m trace_dspy.fit_empathy``: a launcher only; the command is :mod:`trace_dspy.cli.fit_empathy`."""

if __name__ == "__main__":
    from trace_dspy.cli.fit_empathy import main

    raise SystemExit(main())
