"""Small utilities: distributed helpers, atomic file writes, checkpoint IO."""
