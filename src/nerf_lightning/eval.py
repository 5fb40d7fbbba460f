"""``python -m nerf_lightning.eval``: the eval app (``nerf_lightning.apps.eval``)."""

from nerf_lightning.apps.eval import main

if __name__ == "__main__":
    main()
