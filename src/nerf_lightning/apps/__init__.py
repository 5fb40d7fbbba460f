"""The commands: one module per app (train, eval, render, export, view), each a task and its ``main``."""
