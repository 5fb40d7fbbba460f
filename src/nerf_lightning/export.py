"""``python -m nerf_lightning.export``: the export app (``nerf_lightning.apps.export``)."""

from nerf_lightning.apps.export import main

if __name__ == "__main__":
    main()
