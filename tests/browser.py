"""Headless Chromium (Debian's package) for the layout page tests: a screenshot of a local page."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

# The flags a closed network needs: without the background-networking ones Chromium keeps trying
# to reach Google's hosts; as root it needs --no-sandbox.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def screenshot(page: Path, png: Path, width: int = 1500, height: int = 3000) -> None:
    with tempfile.TemporaryDirectory(prefix="kiln-chromium-") as profile:
        subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                        f"--screenshot={png}", page.resolve().as_uri()], capture_output=True, timeout=120, check=True)


def rendered_dom(page: Path) -> str:
    """The page's DOM after Chromium has loaded it and run its scripts."""
    with tempfile.TemporaryDirectory(prefix="kiln-chromium-") as profile:
        return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.resolve().as_uri()],
                              capture_output=True, text=True, timeout=120, check=True).stdout
