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

        # Generate: a prompt, 2 samples, 64 DDPM steps; then scrub back to a step mid-way
        pg.fill("#gen-form textarea", a.prompt)
        pg.fill("#gen-form input[name=samples]", "2")
        pg.fill("#gen-form input[name=steps]", "64")
        pg.click("#gen-button")
        pg.wait_for_selector(done, timeout=120000)
        pg.screenshot(path=str(out / "generate-final.png"), full_page=True)
        pg.locator("#gen-view .slider").fill("12")
        pg.screenshot(path=str(out / "generate-step12.png"), full_page=True)

        # Infill: kept text with gaps
        pg.fill("#gen-form textarea", a.infill)
        pg.click("#gen-button")
        pg.wait_for_selector(done, timeout=120000)
        pg.locator("#gen-view .slider").fill("20")
        pg.screenshot(path=str(out / "infill-step20.png"))
        pg.locator("#gen-view .slider").fill(pg.locator("#gen-view .slider").get_attribute("max"))
        pg.screenshot(path=str(out / "infill-final.png"))

        # Compare: DDPM 64 steps vs DPM-Solver++(2M) 16 steps on the same seed (or two runs)
        pg.click("#tab-compare")
        pg.fill("#cmp-form input[name=text]", a.prompt)
        if len(a.runs) == 1:
            pg.select_option("#side-a .sampler-select", "ddpm")
            pg.select_option("#side-b .sampler-select", "dpmpp2m")
        pg.fill("#side-a input[name=steps]", "64")
        pg.fill("#side-b input[name=steps]", "16")
        pg.click("#cmp-button")
        for side in ("a", "b"):
            pg.wait_for_selector(f"#side-{side} .state[data-state=done]", timeout=120000)
        pg.screenshot(path=str(out / "compare.png"), full_page=True)

        # Runs page
        pg.click("#tab-runs")
        pg.wait_for_function(
            "document.querySelector('#run-page img.curves') && document.querySelector('#run-page img.curves').naturalWidth > 0"
        )
        pg.screenshot(path=str(out / "runs.png"), full_page=True)
        b.close()
    server.should_exit = True
    print(f"wrote {', '.join(sorted(x.name for x in out.glob('*.png')))} to {out}")


if __name__ == "__main__":
    main()
