"""Geometry out of a trained field: meshes and point clouds in the capture's world frame."""
