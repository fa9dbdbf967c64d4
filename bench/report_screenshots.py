"""Screenshots of a recorded run's report in headless Chromium, for docs/record.md.

    python bench/report_screenshots.py RUN_DIR [--out docs/img] [--rank 1 --phase optimizer]

Writes report-overview.png (findings and plots) and report-flame.png (the flame graph of the
chosen rank and phase). Needs Debian's chromium (apt-get install -y chromium).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--hide-scrollbars",
         "--virtual-time-budget=10000"]


def shoot(browser: str, url: str, out: Path, size: str) -> None:
    subprocess.run([browser, *FLAGS, f"--window-size={size}", f"--screenshot={out}", url], check=True,
                   capture_output=True, timeout=120)
    print(f"wrote {out} ({out.stat().st_size // 1024} kB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "img")
    ap.add_argument("--rank", default="all")
    ap.add_argument("--phase", default="all")
    args = ap.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("chromium not found: apt-get install -y chromium", file=sys.stderr)
        return 1
    report = (args.run_dir / "report.html").resolve()
    if not report.is_file():
        print(f"{report}: no report (otel-gpu report {args.run_dir})", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    shoot(browser, report.as_uri(), args.out / "report-overview.png", "1240,1900")
    frag = f"#rank={quote(args.rank)}&phase={quote(args.phase)}&view=flame"
    shoot(browser, report.as_uri() + frag, args.out / "report-flame.png", "1240,700")
    return 0


if __name__ == "__main__":
    sys.exit(main())
