"""What the platform does, as plain functions over a database session, one module per resource.

API routes and admin commands both call these; they raise
:mod:`osmosis_ai.platform.errors` and never see HTTP.
"""
