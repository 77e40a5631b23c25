"""Neutral helpers that depend on nothing else in vitkit (``vitkit.errors`` aside): atomic
file writes (:mod:`vitkit.util.files`), map resampling (:mod:`vitkit.util.grids`) and the one
check of numeric options (:mod:`vitkit.util.numbers`)."""
