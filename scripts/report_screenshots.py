"""Screenshots of report.html, one per section, with headless Chromium (for the README's docs/img/).

    python3 scripts/report_screenshots.py reports/group-stall/report.html docs/img/report [--sections a,b]

For each section it writes a copy of the page that shows only that section (and renders every figure as usual),
and saves PREFIX-SECTION.png. The window is as tall as asked per section; Chromium crops to it."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# section id -> window height in px
SECTIONS = {"verdict": 900, "decomposition": 620, "timeline": 900, "groups": 1000, "waterfall": 900,
            "profile": 1100, "hidden": 700, "understated": 500, "connections": 800}
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--virtual-time-budget=20000"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    sys.exit("chromium not found (scripts/install-deps.sh installs it)")


def shoot(page: Path, section: str, height: int, out: Path, width: int = 1400) -> None:
    text = page.read_text(encoding="utf-8")
    only = f"<style>section{{display:none}}section#{section}{{display:block}}header{{position:static}}</style></head>"
    with tempfile.TemporaryDirectory(prefix="pcapdecomp-shot-") as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(text.replace("</head>", only, 1), encoding="utf-8")
        subprocess.run([chromium(), *FLAGS, f"--user-data-dir={tmp}/profile", f"--window-size={width},{height}",
                        f"--screenshot={out.resolve()}", copy.as_uri()], check=True, capture_output=True, timeout=180)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("prefix", help="output path prefix: PREFIX-SECTION.png")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--width", type=int, default=1400)
    args = ap.parse_args()
    for section in args.sections.split(","):
        out = Path(f"{args.prefix}-{section}.png")
        out.parent.mkdir(parents=True, exist_ok=True)
        shoot(args.page, section, SECTIONS.get(section, 900), out, args.width)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
