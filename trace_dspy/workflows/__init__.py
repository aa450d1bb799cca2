"""Layer 7, workflows: what commands do, as library functions (compile, evaluate, ablate, batch replies, fit)."""
