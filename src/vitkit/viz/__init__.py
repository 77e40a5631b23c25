"""Figures and reports: ``plot`` (matplotlib figures through the object API, never switching the
global backend) and ``report`` (one self-contained HTML file). Needs the ``viz`` extra."""
