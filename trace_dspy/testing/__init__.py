"""Layer 8, testing: fake LMs and a fake OpenAI-compatible server for tests and benchmarks.

They parse prompts with the same code as the embedded engine (``trace_dspy.lm.prompts``).
"""
