"""Videos of a trained field: camera paths (orbit, spiral, nerfstudio files) and the MP4 writer."""
