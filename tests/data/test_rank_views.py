"""Which held-out views each process renders (data/loaders.rank_views)."""

from nerf_lightning.data.loaders import rank_views


def test_each_view_once_over_the_ranks_padded_to_equal_counts() -> None:
    assert rank_views(5, 0, 1) == [0, 1, 2, 3, 4]
    assert [rank_views(5, r, 2) for r in range(2)] == [[0, 2, 4], [1, 3, 3]]
    assert [rank_views(2, r, 4) for r in range(4)] == [[0], [1], [0], [1]]  # more ranks than views
    assert rank_views(0, 1, 2) == []
