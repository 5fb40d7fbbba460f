"""``python -m nerf_lightning.render`` (the app lives in ``nerf_lightning.render_app``)."""

from nerf_lightning.render_app import main

if __name__ == "__main__":
    main()
