"""The HTML view (btcore/views/html.py, btcore/views/page.html) and its WSGI endpoint
(btcore/web.py), checked in a real headless Chromium.

The page comes from a live gevent program (tests/fixtures/html_program.py:
9 greenlets in 3 stack shapes, a spawn tree, one greenlet named with
markup) that serves btcore.web.app and its own app with pywsgi on
127.0.0.1.  The browser is Debian's chromium + chromium-driver, driven by
selenium; the session installs them with apt-get when missing (root with
apt only), else skips with "browser cannot be installed" (ALLOWED_SKIPS).
"""
import html.parser
import json
import os
import select
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

import conftest

from conftest import INTERPRETER_HAS_SYMTAB

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "fixtures", "html_program.py")
HOSTILE_NAME = '</script><b id="pwned">x</b><!--'
# The program's shapes: a Python function only that shape's stack holds, and its greenlet count.
SHAPES = {"spawner": 2, "in_sorted": 4, "in_queue": 3}
OURS = 9                     # greenlets the program parks, all under serve()
BROWSER_SKIP = "browser cannot be installed"
TIMEOUT = 60                 # hang detection only

# ---- the browser ----


@pytest.fixture(scope="session")
def driver():
    why = conftest.apt_install(("chromium", "chromedriver"), ("chromium", "chromium-driver"), BROWSER_SKIP)
    if why:
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000"):
        options.add_argument(arg)
    # The browser is an oracle, not under test: no preloaded sanitizer runtime
    # (ci/asan.sh preloads libasan, which aborts chromedriver)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}
    browser = webdriver.Chrome(service=Service(shutil.which("chromedriver"), env=env), options=options)
    browser.set_page_load_timeout(TIMEOUT)
    yield browser
    browser.quit()


def _open(driver, url):
    driver.get(url)
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(driver, TIMEOUT).until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))


# ---- the live program ----


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """The running program: {"debug": url (with serve()'s token, so more parameters go after "&"),
    "own": url, "html": written page, "proc": Popen}."""
    out = tmp_path_factory.mktemp("html_program")
    page = out / "written.html"
    proc = subprocess.Popen([sys.executable, "-P", PROGRAM, str(page)], stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
        assert ready, "the program did not start serving"
        addresses = json.loads(proc.stdout.readline())
        assert addresses["debug_url"].startswith("http://%s:%d/?token=" % tuple(addresses["debug"]))
        yield {"debug": addresses["debug_url"], "own": "http://%s:%d/" % tuple(addresses["own"]),
               "debug_host": addresses["debug"][0], "html": str(page), "proc": proc}
        urllib.request.urlopen(f"http://127.0.0.1:{addresses['own'][1]}/quit", timeout=TIMEOUT).read()
        assert proc.wait(timeout=TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- what the page shows, read from the DOM ----

_GROUPS_JS = """
return [...document.querySelectorAll('#groups .group')].map(card => ({
  stack: Number(card.dataset.stack),
  count: Number(card.querySelector('.count').firstChild.textContent),
  path: card.querySelector('.path').textContent,
  names: card.querySelector('.names').textContent}));
"""


def _groups(driver):
    return driver.execute_script(_GROUPS_JS)


def _shape_groups(driver):
    """{shape function: group} for the program's groups (their Python path runs through serve)."""
    found = {}
    for group in _groups(driver):
        calls = group["path"].split(" → ")
        for shape in SHAPES:
            if "serve" in calls and shape in calls:
                assert shape not in found, f"two groups for {shape}: {found[shape]}, {group}"
                found[shape] = group
    return found


def _expand(driver, stack):
    """Opens a group; returns its frames as (kind, function) pairs, every folded run shown."""
    return driver.execute_script("""
const card = document.querySelector('#groups .group[data-stack="' + arguments[0] + '"]');
if (!card.querySelector('.body')) card.querySelector('.head').click();
for (const fold of [...card.querySelectorAll('.fold')]) fold.click();
return [...card.querySelector('.frames').querySelectorAll('.frame')].map(
  f => [f.querySelector('.kind').textContent, f.querySelector('.fn').textContent]);
""", stack)


def _filter(driver, text):
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
    box = driver.find_element("id", "filter")
    # typed (the page sees input events): erase what is there, then the text
    box.send_keys(Keys.END + Keys.BACKSPACE * len(box.get_attribute("value")) + text)
    # the page filters 120 ms after the last key; the count line says what it shows
    WebDriverWait(driver, TIMEOUT).until(
        lambda d: d.execute_script("return document.body.dataset.filter === arguments[0]", text.lower()))


# ---- tests ----


def test_live_page_shows_three_groups_with_counts(driver, program, tmp_path):
    """Guards grouping on the page: each stack shape is one group with its greenlet count."""
    _open(driver, program["debug"])
    groups = _shape_groups(driver)
    assert {shape: group["count"] for shape, group in groups.items()} == SHAPES
    assert sum(group["count"] for group in _groups(driver)) == driver.execute_script("return DOC.greenlets.length")
    _expand(driver, groups["in_sorted"]["stack"])
    driver.execute_script("document.querySelector('#groups .group[data-stack=\"' + arguments[0] + '\"]')"
                          ".scrollIntoView({block: 'start'})", groups["in_sorted"]["stack"])
    shot = tmp_path / "page.png"
    driver.save_screenshot(str(shot))
    print(f"screenshot: {shot}")
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_expanded_group_shows_python_and_c_functions(driver, program):
    """Guards the merged frames of an expanded group: Python calls and the C functions between them."""
    _open(driver, program["debug"])
    frames = _expand(driver, _shape_groups(driver)["in_sorted"]["stack"])
    python = [name for kind, name in frames if kind == "py"]
    native = [name for kind, name in frames if kind == "C"]
    assert python[:2] == ["serve", "in_sorted"] and python[-2:] == ["in_sorted.<locals>.<lambda>", "common_wait"]
    assert any(name.endswith("Event.wait [cython]") for name in native)     # gevent's Cython
    if INTERPRETER_HAS_SYMTAB:    # a static function: named by the full symbol table only
        assert "builtin_sorted" in native
        # outermost first: sorted() is called by in_sorted and calls the lambda
        order = [name for _, name in frames]
        assert order.index("in_sorted") < order.index("builtin_sorted") < order.index("in_sorted.<locals>.<lambda>")


def test_spawn_tree_is_navigable(driver, program):
    """Guards the spawn tree: a member's "spawned by" link reveals its spawner, whose children are its spawns."""
    _open(driver, program["debug"])
    groups = _shape_groups(driver)
    _expand(driver, groups["in_sorted"]["stack"])
    spawner_name = driver.execute_script("""
const card = document.querySelector('#groups .group[data-stack="' + arguments[0] + '"]');
const chain = card.querySelectorAll('.members > div')[0].querySelectorAll('.link');
chain[1].click();                       // [0] is the greenlet itself, [1] its spawner
return chain[1].textContent;""", groups["in_sorted"]["stack"])
    found = driver.execute_script("""
const node = document.querySelector('#tree .node.found');
const li = node.parentElement;
return {name: node.textContent,
        kids: [...li.querySelectorAll(':scope > ul > li')].map(k => k.querySelector('.link').textContent)};""")
    assert found["name"] == spawner_name
    assert found["kids"] == [f"stack {groups['in_sorted']['stack']}"] * 2     # each spawner spawned 2 in_sorted
    top = driver.execute_script("return document.querySelector('#tree .node.found').getBoundingClientRect().top")
    assert 0 <= top <= driver.execute_script("return window.innerHeight")     # scrolled into view


def test_expanded_group_lists_its_spawn_site_and_spawners(driver, program):
    """Guards a group's spawn sites on the page (issue 24): the 4 in_sorted greenlets
    come from one site, 2 from each spawner (oracle: gevent's own spawning_greenlet)."""
    _open(driver, program["debug"])
    stack = _shape_groups(driver)["in_sorted"]["stack"]
    _expand(driver, stack)
    shown = driver.execute_script("""
const card = document.querySelector('#groups .group[data-stack="' + arguments[0] + '"]');
return {sites: [...card.querySelectorAll('.spawn-site')].map(e => e.textContent),
        by: [...card.querySelectorAll('.spawn-by')].map(e => e.textContent),
        frames: card.querySelectorAll('.frames').length,
        spawners: DOC.greenlets.filter(g => g.stack === arguments[0]).map(g => byId.get(g.spawned_by).name)};
""", stack)
    first, second = sorted(set(shown["spawners"]))
    assert shown["spawners"].count(first) == shown["spawners"].count(second) == 2
    assert shown["sites"] == ["Spawned at"] and shown["frames"] == 2      # the stack, the site
    assert shown["by"] in ([f"by 2 greenlets: {first} ×2, {second} ×2"], [f"by 2 greenlets: {second} ×2, {first} ×2"])


def test_filter_narrows_groups(driver, program):
    """Guards the filter box: by function, by C function and by greenlet name."""
    _open(driver, program["debug"])
    all_groups = len(_groups(driver))
    _filter(driver, "in_queue")
    assert [g["count"] for g in _groups(driver)] == [SHAPES["in_queue"]]
    _filter(driver, "pwned")                       # part of one greenlet's name
    assert [g["count"] for g in _groups(driver)] == [SHAPES["in_queue"]]
    _filter(driver, "wait_here")
    assert [g["count"] for g in _groups(driver)] == [SHAPES["spawner"]]
    _filter(driver, "")
    assert len(_groups(driver)) == all_groups > 3


def test_untrusted_names_stay_text(driver, program):
    """Guards the escaping: a greenlet name with markup is shown as text and creates no element."""
    _open(driver, program["debug"])
    assert driver.execute_script("return document.getElementById('pwned')") is None
    assert driver.execute_script("return DOC.greenlets.some(g => g.name === arguments[0])", HOSTILE_NAME + " (serve)")
    driver.execute_script("document.querySelector('#groups .group[data-stack=\"' + arguments[0] + '\"] .head').click()",
                          _shape_groups(driver)["in_queue"]["stack"])
    assert HOSTILE_NAME in driver.find_element("id", "groups").text
    assert driver.execute_script("return document.getElementById('pwned')") is None


_FLAME_JS = """
return [...document.querySelectorAll('#flame .flame-node')].map(n => ({
  label: n.textContent, count: Number(n.dataset.count), width: n.getBoundingClientRect().width}));
"""


def test_flame_widest_frame_is_the_most_shared(driver, program):
    """Guards the icicle's widths: proportional to the greenlets under each frame."""
    _open(driver, program["debug"])
    nodes = driver.execute_script(_FLAME_JS)
    root = nodes[0]
    assert root["label"] == "all greenlets" and root["count"] == driver.execute_script("return DOC.greenlets.length")
    ours = {"serve", "spawner", "in_sorted", "in_queue", "wait_here", "common_wait", "in_sorted.<locals>.<lambda>"}
    mine = [n for n in nodes if n["label"] in ours]
    widest = max(mine, key=lambda n: n["width"])
    assert widest["label"] == "serve" and widest["count"] == OURS     # every parked greenlet runs serve()
    for node in nodes:
        assert abs(node["width"] - root["width"] * node["count"] / root["count"]) < 2.5, node
    width = {n["label"]: n["width"] for n in mine}
    assert width["in_sorted"] > width["in_queue"] > width["spawner"]    # 4 > 3 > 2 greenlets


def test_written_file_renders_the_same_offline(driver, program):
    """Guards the self-contained file: offline, it fetches nothing and shows the live page's groups."""
    _open(driver, program["debug"])
    live = {shape: (g["count"], g["path"]) for shape, g in _shape_groups(driver).items()}
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions",
                           {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
    try:
        _open(driver, "file://" + program["html"])
        written = {shape: (g["count"], g["path"]) for shape, g in _shape_groups(driver).items()}
        assert written == live
        assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
        assert len(driver.execute_script(_FLAME_JS)) > 10
    finally:
        driver.execute_cdp_cmd("Network.emulateNetworkConditions",
                               {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})


def test_wsgi_endpoint_while_the_program_serves_its_own_traffic(driver, program):
    """Guards btcore.web under pywsgi: loopback by default, the 3 formats, the program's own traffic keeps flowing."""
    assert program["debug_host"] == "127.0.0.1"
    answers, stop = [], threading.Event()

    # bounded, and more than a browser's page load takes: the debug view no longer holds the
    # program's loop, so 500 requests could all be served before the page was up
    def own_traffic():
        for _ in range(50_000):
            if stop.is_set():
                return
            with urllib.request.urlopen(program["own"], timeout=TIMEOUT) as r:
                answers.append((r.status, r.read()))

    traffic = threading.Thread(target=own_traffic)
    traffic.start()
    try:
        _open(driver, program["debug"])
        with urllib.request.urlopen(program["debug"] + "&format=json", timeout=TIMEOUT) as r:
            assert r.headers["Content-Type"] == "application/json"
            assert r.headers["Referrer-Policy"] == "no-referrer"     # the URL holds the token
            doc = json.load(r)
        with urllib.request.urlopen(program["debug"] + "&format=text", timeout=TIMEOUT) as r:
            text = r.read().decode()
        served_meanwhile = len(answers)
        deadline = time.monotonic() + TIMEOUT     # and it still serves afterwards
        while len(answers) == served_meanwhile and traffic.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(answers) > served_meanwhile
    finally:
        stop.set()
        traffic.join(TIMEOUT)
    # the program's own 3 shapes of parked greenlets (its main greenlet waits alone; pywsgi's
    # handlers of the traffic above may be parked in groups too)
    ours = [s["count"] for s in doc["stacks"] if s["count"] > 1
            and any((f.get("file") or "").endswith("html_program.py") for f in s["frames"])]
    assert doc["version"] == 2 and sorted(ours) == [2, 3, 4], doc["stacks"]
    assert text.startswith("Greenlet dump, pid ") and "=== stack 1: 4 greenlets, suspended ===" in text
    assert served_meanwhile > 0 and all(answer == (200, b"hello") for answer in answers)
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(program["debug"] + "&format=xml", timeout=TIMEOUT)
    assert bad.value.code == 400


# ---- without a browser ----


class _ScriptText(html.parser.HTMLParser):
    """The text of the page's data element, as an HTML parser (the browser's rules) sees it."""

    def __init__(self):
        super().__init__()
        self.inside, self.data, self.tags = False, [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.inside = tag == "script" and ("id", "btcore-data") in attrs

    def handle_endtag(self, tag):
        self.inside = False

    def handle_data(self, data):
        if self.inside:
            self.data.append(data)


def test_page_embeds_untrusted_names_safely(tmp_path):
    """Guards the embedding: a name with </script> stays inside the data element, intact once parsed."""
    script = f"""
import greenlet, btcore
class Named(greenlet.greenlet):
    name = {HOSTILE_NAME!r}
g = Named(lambda: greenlet.getcurrent().parent.switch())
g.switch()
btcore.dump_all(open({str(tmp_path / 'page.html')!r}, 'w'), format="html")
"""
    subprocess.run([sys.executable, "-P", "-c", script], check=True, timeout=TIMEOUT)
    parser = _ScriptText()
    with open(tmp_path / "page.html", encoding="utf-8") as f:
        parser.feed(f.read())
    doc = json.loads("".join(parser.data))
    names = [row[doc["greenlet_fields"].index("name")] for row in doc["greenlet_rows"]]
    assert HOSTILE_NAME in names
    assert "b" not in parser.tags and parser.tags.count("script") == 2


def _embedded_doc(page):
    parser = _ScriptText()
    parser.feed(page)
    return json.loads("".join(parser.data))


def test_demo_writes_the_page():
    """Guards `python -m btcore demo --format html`: the showcase's page, its five connection handlers one group."""
    proc = subprocess.run([sys.executable, "-P", "-m", "btcore", "demo", "--format", "html"],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    doc = _embedded_doc(proc.stdout)
    stack_of = {row[0]: row[doc["greenlet_fields"].index("stack")] for row in doc["greenlet_rows"]}
    names = [row[doc["greenlet_fields"].index("name")] for row in doc["greenlet_rows"]]
    handlers = [row[0] for row, name in zip(doc["greenlet_rows"], names) if name.endswith("(serve_connection)")]
    assert len(handlers) == 5 and len({stack_of[h] for h in handlers}) == 1
    assert sum(s["count"] for s in doc["stacks"]) == len(names)


def test_serve_without_gevent_uses_a_thread(tmp_path):
    """Guards serve() in a program without gevent: a wsgiref thread on 127.0.0.1 answering while main runs."""
    script = """
import sys, urllib.request, btcore.web
server = btcore.web.serve()
assert server.address[0] == "127.0.0.1" and "gevent" not in sys.modules
assert server.url.startswith("http://127.0.0.1:%d/?token=" % server.address[1])
text = urllib.request.urlopen(server.url + "&format=text", timeout=60).read().decode()
assert text.startswith("Greenlet dump"), text
page = urllib.request.urlopen(server.url, timeout=60).read().decode()
assert 'id="btcore-data"' in page
server.stop()
"""
    subprocess.run([sys.executable, "-P", "-c", script], check=True, timeout=TIMEOUT, cwd=tmp_path)


def test_template_is_installed_with_the_package():
    """Guards package-data: the installed btcore carries page.html (the suite uses the installed package)."""
    from importlib import resources
    text = resources.files("btcore.views").joinpath("page.html").read_text(encoding="utf-8")
    assert text.count("{{BTCORE_DATA}}") == 1


def test_every_page_forbids_loading_anything():
    """Guards the shared head (html._HEAD): the greenlet page and the profile page both carry the policy that
    lets them load nothing (their data are a target's strings) and run their inline script only."""
    from btcore.views import html
    for name in ("page.html", "profile.html"):
        head = html._template(name).split("<title>", 1)[0]
        assert head.startswith("<!DOCTYPE html>") and "default-src 'none'; script-src 'unsafe-inline'" in head, name
