"""The explorer: a local web page to look inside a ViT (``vitkit explore``).

- ``session``: :class:`~vitkit.web.session.Explorer`, one model and its bounded cache of
  analysed images; every number comes from :mod:`vitkit.explain`.
- ``app``: the FastAPI app and its guard (token, Host, Origin, body size, headers).
- ``samples``: the fixed table of sample images.
- ``static/``: the page (plain HTML, CSS, JavaScript; no CDN, no build step).
"""
