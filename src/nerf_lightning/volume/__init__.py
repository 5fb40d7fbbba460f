"""Volume rendering: the occupancy grid, marching rays into packed samples through it, and compositing."""
