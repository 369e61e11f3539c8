"""The self-hosted Osmosis platform: its server, and the client the CLI talks to it with."""

from __future__ import annotations
