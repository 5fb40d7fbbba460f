"""``python -m nerf_lightning.view ckpt=RUN``: the trained scene in the browser (the app lives in
``nerf_lightning.apps.view``)."""

from nerf_lightning.apps.view import main

if __name__ == "__main__":
    main()
