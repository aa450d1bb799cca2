"""``python -m trace_dspy.metric_validity``: a launcher only; the command is :mod:`trace_dspy.cli.metric_validity`."""

if __name__ == "__main__":
    from trace_dspy.cli.metric_validity import main

    raise SystemExit(main())
