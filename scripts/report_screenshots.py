"""Screenshots of report.html, one per section, with headless Chromium (docs/img/report-*.png, shown in docs/report.md).

    python3 scripts/report_screenshots.py reports/group-stall/report.html docs/img/report-group-stall
    python3 scripts/report_screenshots.py PAGE PREFIX --sections timeline,groups --width 1200

For each section it shows a copy of the page with only that section (every figure renders as usual), measures its
height, and saves PREFIX-SECTION.png cropped to it."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SECTIONS = ("verdict", "decomposition", "timeline", "groups", "proxy", "waterfall", "profile", "hidden", "understated",
            "connections")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--virtual-time-budget=20000"]
_MEASURE = """<script>(function w(){ if (document.body.getAttribute('data-rendered') === 'no') { setTimeout(w, 50); return; }
  var p = document.createElement('pre'); p.id = 'height';
  p.textContent = JSON.stringify(Math.ceil(document.documentElement.scrollHeight)); document.body.appendChild(p); })();
</script></body>"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    sys.exit("chromium not found (scripts/install-deps.sh installs it)")


def shoot(text: str, section: str, out: Path, width: int) -> bool:
    """False when the page has no such section."""
    if not re.search(f"<section id='{section}'>", text):
        return False
    only = (f"<style>section{{display:none}}section#{section}{{display:block}}header{{position:static}}"
            "body{margin-bottom:0}</style></head>")
    page = text.replace("</head>", only, 1)
    with tempfile.TemporaryDirectory(prefix="pcapdecomp-shot-") as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(page.replace("</body>", _MEASURE, 1), encoding="utf-8")
        run = [chromium(), *FLAGS, f"--user-data-dir={tmp}/profile", f"--window-size={width},800"]
        dom = subprocess.run([*run, "--dump-dom", copy.as_uri()], capture_output=True, text=True, timeout=180).stdout
        m = re.search(r"<pre id=\"height\">(\d+)</pre>", dom)
        height = min(json.loads(m.group(1)) + 10, 4000) if m else 900
        copy.write_text(page, encoding="utf-8")
        subprocess.run([chromium(), *FLAGS, f"--user-data-dir={tmp}/profile", f"--window-size={width},{height}",
                        f"--screenshot={out.resolve()}", copy.as_uri()], check=True, capture_output=True, timeout=180)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("prefix", help="output path prefix: PREFIX-SECTION.png")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--width", type=int, default=1280)
    args = ap.parse_args()
    text = args.page.read_text(encoding="utf-8")
    for section in args.sections.split(","):
        out = Path(f"{args.prefix}-{section}.png")
        out.parent.mkdir(parents=True, exist_ok=True)
        if shoot(text, section, out, args.width):
            print(f"wrote {out}")
        else:
            print(f"{args.page}: no section {section}", file=sys.stderr)


if __name__ == "__main__":
    main()
