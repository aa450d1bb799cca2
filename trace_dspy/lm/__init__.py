"""Layer 2, language models: LM specs and roles, the embedded llama.cpp engine, the prompt parser and adapters."""
