"""The platform's browser pages, served by the same app as the API (``device.py``: approving a
CLI's device-code login). Pages are server-rendered HTML with every value escaped."""
