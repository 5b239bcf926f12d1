"""Screenshots of the ``replaid serve`` playground's main views (for docs/playground/).

Serves the given runs in-process on a free local port and drives Debian's chromium through
playwright: Generate (mid-trajectory and final), Infill, Compare (two samplers, or two runs when
two are given), the Runs page, and steering (issue 26): Edit (mid-trajectory and final) and Generate
with token guidance.

    python scripts/playground_screenshots.py runs/demo --out docs/playground
    python scripts/playground_screenshots.py runs/shakespeare --only-steering --out docs/playground
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
    p.add_argument("--only-steering", action="store_true", help="only Edit and guided Generate (issue 26)")
    p.add_argument(
        "--edit-text",
        default="ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n",
        help="the Edit page's text",
    )
    p.add_argument("--edit-spans", default="17:49,78:84", help="the Edit page's character spans ('' = all)")
    p.add_argument("--edit-strength", default="0.6", help="the Edit page's strength")
    p.add_argument("--edit-step", type=int, default=12, help="the step edit-stepN.png scrubs back to")
    p.add_argument("--guided-prompt", default="ROMEO:", help="guided Generate: the text box")
    p.add_argument("--require", default=" crown", help="guided Generate: required word(s), one per line")
    p.add_argument("--guidance-scale", default="4", help="guided Generate: the scale")
    p.add_argument("--classifier", action="append", default=None, metavar="DIR", help="as replaid serve --classifier")
    p.add_argument(
        "--guide",
        default=None,
        metavar="ID:LABEL",
        help="also generate-classifier.png: Generate with this classifier (its id in the page) and label",
    )
    p.add_argument("--guide-scale", default="4", help="the scale of generate-classifier.png")
    p.add_argument("--guide-run", default=None, help="the run (its id in the page) of generate-classifier.png")
    p.add_argument("--guide-prompt", default="", help="the text box of generate-classifier.png")
    a = p.parse_args()

    import uvicorn
    from playwright.sync_api import sync_playwright

    from replaid.web.app import create_app

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(a.runs, classifiers=a.classifier), host="127.0.0.1", port=port, log_level="warning")
    )
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
        if a.only_steering:
            steering_pages(pg, a, out, done, wait)
            b.close()
            server.should_exit = True
            print(f"wrote the steering screenshots to {out}")
            return
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


def steering_pages(pg, a, out: Path, done: str, wait: int) -> None:
    """Edit (final and scrubbed back to ``--edit-step``) and Generate with a required word."""
    pg.click("#tab-edit")
    pg.fill("#edit-form textarea[name=text]", a.edit_text)
    pg.fill("#edit-form input[name=spans]", a.edit_spans)
    pg.dispatch_event("#edit-form input[name=spans]", "input")  # the span preview
    pg.locator("#edit-form input[name=strength]").fill(a.edit_strength)
    pg.fill("#edit-form input[name=samples]", "2")
    pg.fill("#edit-form input[name=steps]", "64")
    pg.click("#edit-button")
    pg.wait_for_selector("#edit-view .state[data-state=done]", timeout=wait)
    pg.screenshot(path=str(out / "edit-final.png"), full_page=True)
    pg.locator("#edit-view .slider").fill(str(a.edit_step))
    pg.screenshot(path=str(out / f"edit-step{a.edit_step}.png"), full_page=True)

    pg.click("#tab-generate")
    pg.fill("#gen-form textarea[name=text]", a.guided_prompt)
    pg.fill("#gen-form textarea[name=require]", a.require)
    pg.fill("#gen-form input[name=guidance_scale]", a.guidance_scale)
    pg.fill("#gen-form input[name=samples]", "2")
    pg.fill("#gen-form input[name=steps]", "64")
    pg.click("#gen-button")
    pg.wait_for_selector(done, timeout=wait)
    pg.screenshot(path=str(out / "generate-guided.png"), full_page=True)
    if a.guide:  # classifier guidance
        cid, _, label = a.guide.rpartition(":")
        if a.guide_run:
            pg.select_option("#gen-form .run-select", a.guide_run)
        pg.fill("#gen-form textarea[name=text]", a.guide_prompt)
        pg.fill("#gen-form textarea[name=require]", "")
        pg.select_option("#gen-form .classifier-select", cid)
        pg.select_option("#gen-form .label-select", label)
        pg.fill("#gen-form input[name=guidance_scale]", a.guide_scale)
        pg.click("#gen-button")
        pg.wait_for_selector(done, timeout=wait)
        pg.screenshot(path=str(out / "generate-classifier.png"), full_page=True)


if __name__ == "__main__":
    main()
