"""``python -m trace_dspy.evaluate``: a launcher only; the command is :mod:`trace_dspy.cli.evaluate`."""

if __name__ == "__main__":
    from trace_dspy.cli.evaluate import main

    raise SystemExit(main())
