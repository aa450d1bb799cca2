"""``python -m trace_dspy.respond``: a launcher only; the command is :mod:`trace_dspy.cli.respond`."""

if __name__ == "__main__":
    from trace_dspy.cli.respond import main

    raise SystemExit(main())
