"""``python -m trace_dspy.compile``: a launcher only; the command is :mod:`trace_dspy.cli.compile`."""

if __name__ == "__main__":
    from trace_dspy.cli.compile import main

    raise SystemExit(main())
