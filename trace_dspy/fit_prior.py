"""``python -m trace_dspy.fit_prior``: a launcher only; the command is :mod:`trace_dspy.cli.fit_prior`."""

if __name__ == "__main__":
    from trace_dspy.cli.fit_prior import main

    raise SystemExit(main())
