"""``python -m nerf_lightning.train``: the train app (``nerf_lightning.apps.train``)."""

from nerf_lightning.apps.train import main

if __name__ == "__main__":
    main()
