"""The run's lifecycle: its config and folder, checkpoint files and callbacks, resuming, restoring."""
