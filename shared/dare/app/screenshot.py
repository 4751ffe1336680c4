"""The leaderboard in a real browser: `dare leaderboard` on loopback, opened in headless Chromium (Debian's
chromium and chromium-driver, `make browser`). The end-to-end test drives it through these functions, and
`make screenshot` takes the docs' two pictures with them:

    python -m dare.app.screenshot docs/img      # landing.png (Overview), published.png (Published tab)
    python -m dare.app.screenshot --time [URL]  # seconds from opening each tab's link to its first table

The pictures show the committed results only (leaderboard/results/). Beside them, `screenshots.json`
records the fingerprint of the results they show (`results_fingerprint`: the SHA-256 over every committed
JSON's path and bytes); the browser test fails when the committed results have changed since, naming
this command, so the docs never show results older than the repository's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from dare.utils import REPO_ROOT, atomic_write_json

RECORD = "screenshots.json"
PICTURES = {"landing.png": "Overview", "published.png": "Published"}  # file -> the tab it shows
WINDOW = (1500, 1300)


def results_fingerprint(root: Path | None = None) -> str:
    """SHA-256 over the relative path and bytes of every *.json under `root` (default: the committed results,
    leaderboard/results/), in path order: it changes when a result is added, removed or rewritten. Only what the
    leaderboard would read is read (`dare.results.read_bounded`: a regular file of at most `MAX_FILE_BYTES`, no link
    out of `root`); anything else (a FIFO, a link to /dev/zero) counts by its name alone."""
    from dare.results import MAX_FILE_BYTES, read_bounded

    root = Path(root or REPO_ROOT / "leaderboard" / "results")
    digest = hashlib.sha256()
    for path in sorted(root.glob("**/*.json")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        try:
            data = read_bounded(path, MAX_FILE_BYTES, folder=root)
        except ValueError:
            data = b"\0not read"  # the same on every machine (the reason may name a machine's path)
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def leaderboard(runs: list[Path] | None = None, port: int | None = None, env: dict | None = None):
    """`dare leaderboard` on 127.0.0.1 (with `--runs` when given) until the block ends; yields its URL once the
    port accepts connections (60 s at most), and stops the server after."""
    port = port or free_port()
    exe = Path(sys.executable).parent / "dare"
    cmd = [str(exe), "leaderboard", "--port", str(port)] + [a for r in runs or [] for a in ("--runs", str(r))]
    log = tempfile.TemporaryFile()  # the server's output, read only to say why it did not start (a pipe nobody
    app = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,  # reads could fill and block)
                           env={**os.environ, **(env or {})})
    try:
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or app.poll() is not None:
                    log.seek(0)
                    out = log.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"dare leaderboard did not start on port {port}: {out}")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        app.terminate()
        app.wait(timeout=30)
        log.close()


@contextmanager
def chromium(width: int = WINDOW[0], height: int = WINDOW[1]):
    """Headless Chromium through its WebDriver (both from `make browser`), quit when the block ends."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        raise RuntimeError("chromium and chromedriver are not installed: run `make browser`")
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}", "--hide-scrollbars"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def page_text(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def wait_for(driver, text: str, timeout: float = 90) -> str:
    """Wait until the page shows `text`; the page's text."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: text in page_text(d))
    return page_text(driver)


def open_tab(driver, label: str) -> None:
    from selenium.webdriver.common.by import By

    next(t for t in driver.find_elements(By.CSS_SELECTOR, '[role="tab"]') if t.text == label).click()


def table_rows(driver) -> list[str]:
    """The text of every row of the static tables on the page (`st.table`), visible tab or not."""
    from selenium.webdriver.common.by import By

    return [row.get_attribute("textContent") for row in driver.find_elements(By.CSS_SELECTOR, "table tbody tr")]


def grid_rows(driver) -> list[str]:
    """The text of the rows the data frames on the page show (`st.dataframe` draws on a canvas; its accessible grid
    holds the rows in view)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return [row.get_attribute("textContent") for row in driver.find_elements(By.CSS_SELECTOR, '[role="row"]')]
    except StaleElementReferenceException:  # redrawn while read
        return []


def wait_until(driver, condition, timeout: float = 90) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(condition)


def _save(driver, path: Path) -> None:
    """The page's picture at `path`, written whole or not at all (beside it, then renamed)."""
    part = path.with_name(f".{path.name}.part.png")
    driver.save_screenshot(str(part))
    os.replace(part, path)


def take(out: Path) -> dict:
    """The docs' pictures of the committed results: the Overview (landing.png) and the Published tab
    (published.png), with `screenshots.json` (the results' fingerprint, the time, the command)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"DARE_LEADERBOARD_RUNS": ""}  # committed results only
    with leaderboard(env=env) as url, chromium() as driver:
        driver.get(url)
        wait_for(driver, "What is here.")
        wait_for(driver, "Proxy check")  # the landing view's last section (a star is drawn only where one method wins)
        time.sleep(2)  # the charts draw after the tables
        _save(driver, out / "landing.png")
        open_tab(driver, "Published")
        wait_for(driver, "No published number")
        wait_until(driver, lambda d: any("not run here" in row for row in grid_rows(d)))
        driver.execute_script("window.scrollTo(0, 0)")
        time.sleep(2)
        _save(driver, out / "published.png")
    record = {"results": results_fingerprint(), "taken": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "command": "make screenshot", "pictures": sorted(PICTURES)}
    atomic_write_json(out / RECORD, record)
    return record


TABS = ("Overview", "Leaderboard", "Families", "Compute", "By method", "Published", "Speed", "Run detail")
FIRST = '[data-testid="stTable"], [data-testid="stDataFrame"], [data-testid="stVegaLiteChart"]'


def first_shown(driver) -> bool:
    """A table, a data frame or a chart (`FIRST`) is shown: the open tab's first content is there."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return any(e.is_displayed() for e in driver.find_elements(By.CSS_SELECTOR, FIRST))
    except StaleElementReferenceException:  # redrawn while looked at
        return False


def tab_times(tabs=TABS, repeats: int = 3, url: str | None = None, timeout: float = 120) -> dict[str, list[float]]:
    """Seconds from opening each tab's link (`?tab=<label>`: a new session, the script runs for it; an app without
    such links opens the Overview, and the tab is clicked once the tab bar is there) to its first content
    (`first_shown`), `repeats` times each (the tabs in turn), in the app at `url` (default: `dare leaderboard` on
    the committed results). One page opening before them fills the server's caches (the first visitor's cost is
    not a tab's)."""
    from contextlib import nullcontext

    from selenium.webdriver.common.by import By

    def selected(d) -> list[str]:
        return [t.text for t in d.find_elements(By.CSS_SELECTOR, '[role="tab"][aria-selected="true"]')]

    out: dict[str, list[float]] = {}
    with (nullcontext(url) if url else leaderboard(env={"DARE_LEADERBOARD_RUNS": ""})) as url, chromium() as driver:
        driver.get(url)
        wait_until(driver, first_shown, timeout)
        for tab in [t for _ in range(repeats) for t in tabs]:
            driver.get("about:blank")
            start = time.perf_counter()
            driver.get(f"{url}/?tab={quote(tab)}")
            wait_until(driver, selected, timeout)
            if tab not in selected(driver):
                open_tab(driver, tab)
            wait_until(driver, first_shown, timeout)
            out.setdefault(tab, []).append(round(time.perf_counter() - start, 2))
    return out


def stale(folder: Path, results: Path | None = None) -> str | None:
    """Why the pictures in `folder` do not show the committed results (`results`: another folder of them),
    None when they do."""
    path = Path(folder) / RECORD
    missing = [name for name in PICTURES if not (Path(folder) / name).is_file()]
    if missing or not path.is_file():
        return f"{folder}: {', '.join(missing) or RECORD} missing: run `make screenshot`"
    if json.loads(path.read_text()).get("results") != results_fingerprint(results):
        return (f"{folder}: the pictures show older results than leaderboard/results/ holds now: run "
                "`make screenshot` and commit them")
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--time"]:  # [URL]: an app already running (another version, to compare)
        load = os.getloadavg()[0]
        for tab, seconds in tab_times(url=argv[1] if len(argv) > 1 else None).items():
            print(f"{tab}: {sorted(seconds)[len(seconds) // 2]:.2f} s to its first table (median of "
                  f"{', '.join(f'{x:.2f}' for x in seconds)})")
        print(f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores")
        return 0
    out = Path(argv[0]) if argv else REPO_ROOT / "docs" / "img"
    record = take(out)
    print(f"{', '.join(f'{out}/{p}' for p in record['pictures'])} taken from the committed results "
          f"(fingerprint {record['results'][:12]}); {out}/{RECORD} records it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
