"""Small utilities: distributed helpers, atomic file writes, precision choice."""
