"""``python -m nerf_lightning.process``: the process app (``nerf_lightning.apps.process``)."""

from nerf_lightning.apps.process import main

if __name__ == "__main__":
    main()
