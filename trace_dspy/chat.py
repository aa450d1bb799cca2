"""``python -m trace_dspy.chat``: a launcher only; the command is :mod:`trace_dspy.cli.chat`."""

if __name__ == "__main__":
    from trace_dspy.cli.chat import main

    raise SystemExit(main())
