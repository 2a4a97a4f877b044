"""The studio page's weight and load time on localhost.

Starts the studio (uvicorn, 127.0.0.1), then:

* weight: the bytes of every resource the page loads (the HTML, its scripts and styles, the schema
  and the first check's answer), as served, uncompressed;
* load time in headless Chromium (where Playwright and a system Chromium are installed): from
  navigation to the beginner form drawn with its first check answered, and to the expert view
  (every field) drawn, the median of ``--repeats`` fresh page loads.

    python benchmarks/bench_studio_page.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import socket
import statistics
import threading
import time
import urllib.request

TOKEN = secrets.token_urlsafe(32)
"""The studio's token: every request but the page sends it (a header here, the token URL's cookie in Chromium)."""


def start_server() -> tuple[str, object]:
    """The studio on a free localhost port: ``(base URL, uvicorn server)``."""
    import uvicorn

    from hybrid_rl.studio.server import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opener = urllib.request.build_opener()
    opener.addheaders = [("X-Studio-Token", TOKEN)]
    urllib.request.install_opener(opener)
    server = uvicorn.Server(uvicorn.Config(create_app(TOKEN), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server


def weight(url: str) -> dict[str, int]:
    """Bytes of each resource the page loads (GETs; the first check and path check are POSTs of an
    empty form)."""
    import json
    import re

    sizes = {}
    html = urllib.request.urlopen(url + "/").read()
    sizes["/"] = len(html)
    for path in re.findall(rb'(?:src|href)="(/static/[^"]+)"', html):
        sizes[path.decode()] = len(urllib.request.urlopen(url + path.decode()).read())
    sizes["/api/schema"] = len(urllib.request.urlopen(url + "/api/schema").read())
    request = urllib.request.Request(url + "/api/check", data=json.dumps({"values": {}}).encode(),
                                     headers={"Content-Type": "application/json"})
    sizes["/api/check"] = len(urllib.request.urlopen(request).read())
    request = urllib.request.Request(url + "/api/paths", data=json.dumps({"values": {}}).encode(),
                                     headers={"Content-Type": "application/json"})
    sizes["/api/paths"] = len(urllib.request.urlopen(request).read())
    return sizes


def load_times(url: str, repeats: int) -> dict[str, float]:
    """Median seconds from navigation to the beginner form checked, and to the expert view drawn."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    beginner, expert = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        for _ in range(repeats):
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            start = time.perf_counter()
            page.goto(f"{url}/?token={TOKEN}")  # sets the cookie and redirects to the page
            page.wait_for_function("document.querySelectorAll('[data-error-for]').length > 0 && checks > 0")
            page.wait_for_load_state("networkidle")
            beginner.append(time.perf_counter() - start)
            start = time.perf_counter()
            page.check("input[name=view][value=expert]")
            page.wait_for_function("document.querySelectorAll('[data-error-for]').length == schema.fields.length")
            expert.append(time.perf_counter() - start)
            page.close()
        browser.close()
    return {"beginner_s": statistics.median(beginner), "expert_switch_s": statistics.median(expert)}


def main() -> None:
    """Print the page's weight per resource and its load times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    url, server = start_server()
    try:
        sizes = weight(url)
        for path, size in sizes.items():
            print(f"{path:<45} {size / 1024:8.1f} KiB")
        print(f"{'total':<45} {sum(sizes.values()) / 1024:8.1f} KiB")
        try:
            times = load_times(url, args.repeats)
        except ImportError as error:
            print(f"load time not measured: {error}")
        else:
            print(f"beginner view drawn and checked: {times['beginner_s']:.2f} s; expert view drawn: "
                  f"{times['expert_switch_s']:.2f} s (median of {args.repeats})")
    finally:
        server.should_exit = True


if __name__ == "__main__":
    main()
