"""Launcher shims; installed as the ``sentinel_hooks`` package. ``sentinel run`` puts this
folder on ``PYTHONPATH`` so that ``sitecustomize.py`` runs in every Python it starts."""
