"""``replaid serve``: a local browser playground over trained runs (FastAPI + server-sent events).

``engine.py`` turns one generation request into display frames through the samplers' per-step
callbacks; ``app.py`` is the server; ``static/`` holds the page (plain HTML/JS/CSS, no build step).
"""
