"""The commands: one module per app (train, eval, render, export), each a task function and its ``main``."""
