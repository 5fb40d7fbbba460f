"""The command-line apps, one module per command (``python -m nerf_lightning.<app>`` runs each)."""
