"""The platform's HTTP API: ``create_platform_app`` (``app.py``) and one router module per
resource under ``/api/cli``, each a thin layer over :mod:`osmosis_ai.platform.services`."""
