"""The commands: one module per app (train, eval, render, export, process), each a task function and its
``main``."""
