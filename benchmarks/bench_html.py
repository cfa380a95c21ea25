"""The HTML view for 10 000 parked gevent greenlets in 3 stack shapes.

The program: N gevent greenlets (default 10 000) parked in three places
(Event.wait 5 Python calls deep, Queue.get, a sorted() key callback waiting
on an Event: Python -> C -> Python).  Measured:

  snapshot          btcore.snapshot() alone (median of the rounds, warm)
  page              btcore.views.html.page(infos): resolve, JSON, template (median, warm)
  dump_all html     snapshot + page, as dump_all(format="html") does it (median, warm)
  size              bytes of the page
  first paint       headless Chromium (Debian's chromium + chromedriver, via
                    selenium) opening the file: first-contentful-paint, and
                    "ready" (the page's performance mark once everything is drawn)
  expand / filter   time the page takes to open the largest group and to apply a filter

Targets (issue 16): generated <= 1 s, file <= 2 MB, first paint <= 2 s.

Usage: python benchmarks/bench_html.py [--greenlets N] [--rounds R] [--no-browser]
Imports the installed btcore.  Prints a table; exits 0 whatever the result
(a report, not a test).
"""
import argparse
import io
import os
import shutil
import statistics
import tempfile
import time


import btcore
from parked import park   # benchmarks/ is the script's directory, first on sys.path
import btcore.views.html


def median_time(fn, rounds):
    fn()   # warm: names resolved once, as in a long-running process
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times)


def dump_html():
    out = io.StringIO()
    btcore.dump_all(out, format="html")
    return out.getvalue()


def browser_figures(path):
    """{name: ms} measured in headless Chromium, or None if it is not installed."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get("file://" + path)
        WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))
        figures = driver.execute_script("""
const paint = performance.getEntriesByName('first-contentful-paint')[0];
const ready = performance.getEntriesByName('btcore-ready')[0];
let t = performance.now();
document.querySelector('#groups .group .head').click();
const expand = performance.now() - t;
t = performance.now();
document.getElementById('filter').value = 'deep';
applyFilter();
const filter = performance.now() - t;
return {"first contentful paint": paint ? paint.startTime : null, "ready (all drawn)": ready.startTime,
        "expand largest group": expand, "filter": filter};""")
    finally:
        driver.quit()
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--greenlets", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    _, release = park(args.greenlets, ("deep", "queue", "callback"))
    try:
        snap = median_time(btcore.snapshot, args.rounds)
        infos = btcore.snapshot()
        page = median_time(lambda: btcore.views.html.page(infos), args.rounds)
        del infos
        whole = median_time(dump_html, args.rounds)
        text = dump_html()
    finally:
        release()
    fd, path = tempfile.mkstemp(suffix=".html")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"{args.greenlets} greenlets in 3 shapes, btcore {btcore.__version__}, {args.rounds} warm rounds")
    for name, (median, lo, hi) in (("snapshot", snap), ("page (from a snapshot)", page),
                                   ("dump_all(format='html')", whole)):
        print(f"  {name:26s} {median:6.3f} s  (min {lo:.3f}, max {hi:.3f})")
    print(f"  {'size':26s} {len(text.encode()) / 1e6:6.2f} MB  ({len(text.encode())} bytes)   target <= 2 MB")
    figures = None if args.no_browser else browser_figures(path)
    if figures is None:
        print("  browser: not measured (chromium/chromedriver missing or --no-browser)")
    else:
        for name, ms in figures.items():
            print(f"  {name:26s} {ms / 1000:6.3f} s" if ms is not None else f"  {name:26s} n/a")
    print("targets: generated <= 1 s, file <= 2 MB, first paint <= 2 s")
    os.unlink(path)


if __name__ == "__main__":
    main()
