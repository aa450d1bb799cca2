"""The program's own layer: parts that run inside ``TraceProgram`` (see the "One-way layers" design)."""
