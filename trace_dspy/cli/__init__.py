"""Layer 10, commands: one thin module per ``python -m trace_dspy.<command>`` (arguments, printing, exit codes).

Commands import only ``trace_dspy.cli.common`` and the layers below; never each other.
"""
