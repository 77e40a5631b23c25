"""Neutral helpers that depend on nothing else in vitkit (``vitkit.errors`` aside): atomic
file writes (:mod:`vitkit.util.files`) and map resampling (:mod:`vitkit.util.grids`)."""
