"""The explorer: a local web page to look inside a ViT (``vitkit explore``).

- ``session``: :class:`~vitkit.web.session.Explorer`, one model and its analysed images; every
  number comes from :mod:`vitkit.explain`.
- ``checks``: what the explorer offers for a model, and the check of every argument.
- ``cache``: the bounded LRU cache (bytes and entries) the explorer keeps its results in.
- ``app``: the FastAPI app, its wiring and its guard (token, Host, Origin, body size, headers).
- ``routes``: the API routes, written over ``query`` (typed, validated query parameters).
- ``samples``: the fixed table of sample images.
- ``static/``: the page (plain HTML, CSS, JavaScript; no CDN, no build step).
"""
