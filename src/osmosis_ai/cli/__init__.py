"""The ``osmosis`` command line: parses, calls one library function, renders the result."""
