"""``python -m trace_dspy.fit_relevance``: a launcher only; the command is :mod:`trace_dspy.cli.fit_relevance`."""

if __name__ == "__main__":
    from trace_dspy.cli.fit_relevance import main

    raise SystemExit(main())
