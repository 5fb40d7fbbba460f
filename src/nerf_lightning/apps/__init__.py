"""The commands: one module per app (train, eval, render, export, process, view), each a task and its
``main``."""
