"""``python -m nerf_lightning.process images=DIR|video=FILE out=DIR``: photos or a video -> a capture.

The app lives in :mod:`nerf_lightning.apps.process` (config ``conf/process.yaml``).
"""

from nerf_lightning.apps.process import main

if __name__ == "__main__":
    main()
