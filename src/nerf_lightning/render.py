"""``python -m nerf_lightning.render``: the render app (``nerf_lightning.apps.render``)."""

from nerf_lightning.apps.render import main

if __name__ == "__main__":
    main()
