"""The compact writer: everything the program does only because its model is small (the embedded SmolLM2-135M).

Only ``trace_dspy.program.writers``, the writer switch, imports this package, and only when the compact writer is
chosen (``ProgramConfig.writer``; see ``trace_dspy.compact.writer`` for what it does).
"""
