"""Policies that run in the search environment: prompted methods and trained-policy protocols.

``methods.get(name, **options)`` builds a registered method; ``methods.available()`` lists them.
"""
from methods import baselines, deepnote, kair, main_rag, maps, seeds, seek  # noqa: F401,E402  (registers the methods)
from methods.base import Method, available, get, register  # noqa: F401
