"""The web console's static files (an ES-module app; no build step, nothing from a CDN).

The app calls the same JSON routes as the SDK with the API key in ``Authorization``, so
every check those routes make applies; the key is held in the page's memory only.
"""

from __future__ import annotations

from pathlib import Path

STATIC = Path(__file__).parent / "static"
