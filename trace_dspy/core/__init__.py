"""Layer 1, core: labels, dialogues, configuration, the stage registry and plain helpers (safe JSON, atomic files,
tables).  Core imports nothing else from trace_dspy.
"""
