"""Screenshots of the ``replaid serve`` playground's main views (for docs/playground/).

Serves the given runs in-process on a free local port and drives Debian's chromium through
playwright: Generate (mid-trajectory and final), Infill, Compare (two samplers, or two runs when
two are given) and the Runs page.

    python scripts/playground_screenshots.py runs/demo --out docs/playground
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+")
    p.add_argument("--out", default="docs/playground")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--prompt", default="Return the")
    p.add_argument("--infill", default="Return the [[6]] of the [[3]].")
    p.add_argument(
        "--compare-a", default=None, help="SAMPLER:STEPS of Compare's left side (default: ddpm:64; two runs: :64)"
    )
    p.add_argument(
        "--compare-b", default=None, help="SAMPLER:STEPS of Compare's right side (default: dpmpp2m:16; two runs: :16)"
    )
    p.add_argument("--only-compare", action="store_true", help="only the Compare page (e.g. teacher vs student)")
    p.add_argument("--compare-name", default="compare.png", help="file name of the Compare screenshot")
    p.add_argument("--timeout", type=int, default=120, help="seconds to wait for a generation")
    a = p.parse_args()

    import uvicorn
    from playwright.sync_api import sync_playwright

    from replaid.web.app import create_app

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(a.runs), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.1)
    done = "#gen-view .state[data-state=done]"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=a.chromium, args=FLAGS, headless=True)
        pg = b.new_page(viewport={"width": 1360, "height": 760}, device_scale_factor=1)
        pg.goto(f"http://127.0.0.1:{port}/")
        pg.wait_for_selector("#gen-form .run-select option", state="attached")

        wait = a.timeout * 1000
        if not a.only_compare:
            generate_pages(pg, a, out, done, wait)

        # Compare: --compare-a vs --compare-b on the same seed (two samplers of one run, or two runs)
        pg.click("#tab-compare")
        pg.fill("#cmp-form input[name=text]", a.prompt)
        one = len(a.runs) == 1  # one run: two samplers; two runs: each run's default unless given
        for side, spec in (
            ("a", a.compare_a or ("ddpm:64" if one else ":64")),
            ("b", a.compare_b or ("dpmpp2m:16" if one else ":16")),
        ):
            sampler, steps = spec.split(":")
            if sampler:
                pg.select_option(f"#side-{side} .sampler-select", sampler)
            pg.fill(f"#side-{side} input[name=steps]", steps)
        pg.click("#cmp-button")
        for side in ("a", "b"):
            pg.wait_for_selector(f"#side-{side} .state[data-state=done]", timeout=wait)
        pg.screenshot(path=str(out / a.compare_name), full_page=True)

        if not a.only_compare:  # Runs page
            pg.click("#tab-runs")
            pg.wait_for_function(
                "document.querySelector('#run-page img.curves') && document.querySelector('#run-page img.curves').naturalWidth > 0"
            )
            pg.screenshot(path=str(out / "runs.png"), full_page=True)
        b.close()
    server.should_exit = True
    print(f"wrote {', '.join(sorted(x.name for x in out.glob('*.png')))} to {out}")


def generate_pages(pg, a, out: Path, done: str, wait: int) -> None:
    """Generate (final and mid-trajectory) and Infill screenshots."""
    # Generate: a prompt, 2 samples, 64 DDPM steps; then scrub back to a step mid-way
    pg.fill("#gen-form textarea[name=text]", a.prompt)
    pg.fill("#gen-form input[name=samples]", "2")
    pg.fill("#gen-form input[name=steps]", "64")
    pg.click("#gen-button")
    pg.wait_for_selector(done, timeout=wait)
    pg.screenshot(path=str(out / "generate-final.png"), full_page=True)
    pg.locator("#gen-view .slider").fill("12")
    pg.screenshot(path=str(out / "generate-step12.png"), full_page=True)

    # Infill: kept text with gaps
    pg.fill("#gen-form textarea[name=text]", a.infill)
    pg.click("#gen-button")
    pg.wait_for_selector(done, timeout=wait)
    pg.locator("#gen-view .slider").fill("20")
    pg.screenshot(path=str(out / "infill-step20.png"))
    pg.locator("#gen-view .slider").fill(pg.locator("#gen-view .slider").get_attribute("max"))
    pg.screenshot(path=str(out / "infill-final.png"))


if __name__ == "__main__":
    main()
