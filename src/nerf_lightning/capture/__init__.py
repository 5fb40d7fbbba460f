"""Photos or a video -> a capture: frames, structure from motion (pycolmap), an instant-ngp transforms.json.

- ``sharpness``: variance of the Laplacian, as instant-ngp's ``colmap2nerf.py`` scores frames;
- ``video``: about N frames of a clip, the sharpest of each stretch;
- ``photos``: a folder of photos checked and copied (or linked) into the capture;
- ``sfm``: SIFT, matching, incremental mapping and bundle adjustment with pycolmap;
- ``normalize``: COLMAP's world oriented, centred and scaled as ``colmap2nerf.py`` does, and the
  ``aabb_scale`` the sparse points ask for;
- ``transforms``: the instant-ngp ``transforms.json``.

The app that runs them is ``nerf_lightning.apps.process`` (``python -m nerf_lightning.process``).
"""
