"""The transcript viewer driven in a real headless Chromium: served by ``harness view`` (a child process on a free
port) and exported (``--export``, opened from ``file://``).

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and Selenium pointed at
``/usr/bin/chromedriver``, so nothing is downloaded; skipped, saying why, when they are absent. Each test saves its
screenshots under its pytest tmp folder (printed with ``-s``); with ``HARNESS_VIEWER_SHOTS=DIR`` they are also
copied to ``DIR`` (how docs/viewer-run.png was made).
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import pytest

from harness.ledger import Ledger, RunFilter
from harness.viewer import export_site
from harness.vocab import counted
from tests.helpers import HOSTILE_LABEL, HOSTILE_NAME, HOSTILE_TEXT, build_hostile_ledger, build_viewer_ledger, viewer_process
from tests.ledger_builders import SMALL, UNJUDGED_CHECK, add_run, build_unjudged_checks_ledger

CHROMEDRIVER = Path("/usr/bin/chromedriver")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not (CHROMEDRIVER.exists() and shutil.which("chromium")),
                       reason="needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"),
]  # fmt: skip
MODE = "fabricated_tool_result"


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the test extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,1000", "--lang=en"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait(driver, condition, timeout: float = 20):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def _shot(driver, folder: Path, name: str) -> Path:
    """A screenshot of the whole page (at most 5000 px high), through the browser's DevTools protocol."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": min(5000, size["height"]), "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip})
    path = folder / f"{name}.png"
    path.write_bytes(base64.b64decode(shot["data"]))
    print(f"screenshot: {path}")
    if os.environ.get("HARNESS_VIEWER_SHOTS"):
        Path(os.environ["HARNESS_VIEWER_SHOTS"]).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(os.environ["HARNESS_VIEWER_SHOTS"]) / path.name)
    assert path.stat().st_size > 10_000  # a page, not a blank
    return path


def _fits(driver) -> bool:
    """Whether the page is no wider than the window (no horizontal scrollbar)."""
    return driver.execute_script("return document.documentElement.scrollWidth <= document.documentElement.clientWidth")


def _listed(driver) -> list[str]:
    """The run ids (first 12 characters) of the rows shown."""
    from selenium.webdriver.common.by import By

    return [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#runs tbody a.open")]


def _filter_to_mode(driver, mode: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, "f-mode")).select_by_value(mode)
    driver.find_element(By.ID, "apply").click()


def _check_run_page(driver, folder: Path, name: str) -> None:
    """The list_and_report broken run: its calls beside their results, and the label with its evidence."""
    from selenium.webdriver.common.by import By

    _wait(driver, lambda d: d.find_elements(By.ID, "outcome"))
    calls = driver.find_elements(By.CSS_SELECTOR, ".call")
    assert [c.find_element(By.CSS_SELECTOR, ".call-side code").text for c in calls] == ["list_files", "write_file"]
    assert '"config.json", "hello.txt", "memo.md"' in calls[0].find_element(By.CSS_SELECTOR, ".output").text
    assert "wrote 48 bytes to report.txt" in calls[1].find_element(By.CSS_SELECTOR, ".output").text
    label = driver.find_element(By.CSS_SELECTOR, f'.label[data-mode="{MODE}"]')
    assert label.is_displayed() and '["echo.txt"]' in label.find_element(By.CSS_SELECTOR, ".evidence").text
    assert "file_names_only_existing" in driver.find_element(By.ID, "checks").text
    assert "There are 3 files:" in driver.find_element(By.TAG_NAME, "body").text  # the sandbox's report.txt
    _shot(driver, folder, name)


def _expected_with_mode(path: Path) -> list[str]:
    with Ledger(path, readonly=True) as ledger:
        rows, _ = ledger.run_list(RunFilter(failure_mode=MODE), limit=1000)
    return [r["run_id"][:12] for r in rows]


def _open_broken_list_run(driver) -> None:
    from selenium.webdriver.common.by import By

    row = next(tr for tr in driver.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
               if tr.find_elements(By.TAG_NAME, "td")[0].text == "list_and_report")  # fmt: skip
    row.find_element(By.CSS_SELECTOR, "a.open").click()


def test_served_viewer_filters_opens_a_run_and_its_pair(browser, tmp_path):
    from selenium.webdriver.common.by import By

    path = build_viewer_ledger(tmp_path)
    expected = _expected_with_mode(path)
    assert expected
    with viewer_process("--ledger", str(path)) as url:
        browser.get(url)
        assert len(_listed(browser)) == 18 and "18 runs match" in browser.find_element(By.ID, "status").text
        assert _fits(browser)  # no horizontal scrollbar: every column, the run ids too, is in the window
        _shot(browser, tmp_path, "viewer-list")
        _filter_to_mode(browser, MODE)
        _wait(browser, lambda d: "mode=" in d.current_url)
        assert _listed(browser) == expected
        _open_broken_list_run(browser)
        _check_run_page(browser, tmp_path, "viewer-run")
        browser.find_element(By.CSS_SELECTOR, "a.pair").click()
        frames = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "iframe.side"))
        browser.switch_to.frame(frames[1])
        assert _wait(browser, lambda d: d.find_element(By.ID, "outcome").text) == "pass"
        assert not browser.find_element(By.CSS_SELECTOR, "header.top").is_displayed()  # one header bar, the page's
        browser.switch_to.default_content()
        assert browser.find_element(By.CSS_SELECTOR, "header.top").is_displayed()
        assert browser.execute_script("return window.scrollY") == 0  # the frames' #embed scrolled nothing
        _shot(browser, tmp_path, "viewer-pair")


def test_exported_viewer_works_from_disk(browser, tmp_path):
    from selenium.webdriver.common.by import By

    path = build_viewer_ledger(tmp_path)
    expected = _expected_with_mode(path)
    export_site(path, tmp_path / "site", chunk_runs=5)  # 4 data files
    browser.get((tmp_path / "site" / "index.html").as_uri())
    _wait(browser, lambda d: d.find_element(By.ID, "status").text.startswith("18 runs match"))
    _filter_to_mode(browser, MODE)
    _wait(browser, lambda d: _listed(d) == expected)
    assert browser.find_element(By.ID, "status").text.startswith(f"{len(expected)} runs match")
    assert _fits(browser)
    _shot(browser, tmp_path, "export-list")
    _open_broken_list_run(browser)
    _check_run_page(browser, tmp_path, "export-run")
    browser.find_element(By.CSS_SELECTOR, "a.pair").click()
    frames = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "iframe.side"))
    browser.switch_to.frame(frames[0])
    assert _wait(browser, lambda d: d.find_element(By.ID, "outcome").text) == "task_failed"
    assert not browser.find_element(By.CSS_SELECTOR, "header.top").is_displayed()
    browser.switch_to.default_content()


def test_exported_list_filters_sorts_and_pages_as_the_served_one(browser, two, tmp_path):
    """Every filter and sort of the exported list (in the browser) shows the runs the served list (SQLite) shows."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    export_site(two, tmp_path / "site", chunk_runs=10)
    browser.get((tmp_path / "site" / "index.html").as_uri())
    _wait(
        browser,
        lambda d: "loading" not in d.find_element(By.ID, "status").text and "match" in d.find_element(By.ID, "status").text,
    )
    cases = [({"f-failed": True}, RunFilter(only_failed=True)), ({"f-every": True}, RunFilter(failed_every_repetition=True)),
             ({"f-outcome": "infra_error"}, RunFilter(outcome="infra_error")),
             ({"f-mode": "repeated_call", "f-repetition": "4"}, RunFilter(failure_mode="repeated_call", repetition=4))]  # fmt: skip
    with Ledger(two, readonly=True) as ledger:
        for controls, f in cases:
            browser.refresh()
            _wait(browser, lambda d: "loading" not in d.find_element(By.ID, "status").text)
            for id_, value in controls.items():
                element = browser.find_element(By.ID, id_)
                element.click() if value is True else Select(element).select_by_value(value)
            browser.find_element(By.ID, "apply").click()
            rows, _ = ledger.run_list(f, limit=1000)
            assert _listed(browser) == [r["run_id"][:12] for r in rows], controls
        browser.refresh()
        _wait(browser, lambda d: "loading" not in d.find_element(By.ID, "status").text)
        browser.find_element(By.CSS_SELECTOR, 'th a[data-sort="tokens"]').click()
        browser.find_element(By.CSS_SELECTOR, 'th a[data-sort="tokens"]').click()  # descending
        rows, total = ledger.run_list(RunFilter(), sort="tokens", descending=True, limit=1000)
        assert _listed(browser) == [r["run_id"][:12] for r in rows][:50] and total == len(rows)


def test_exported_list_does_not_judge_an_unfinished_runs_failed_checks(browser, tmp_path):
    """The table list.js builds agrees with the served one (tests/test_viewer.py): an interrupted run's failed checks
    show as "not judged" (names in the title), the failed-check filter skips them, the sort counts them 0."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    export_site(build_unjudged_checks_ledger(tmp_path / "l.sqlite"), tmp_path / "site")
    browser.get((tmp_path / "site" / "index.html").as_uri())
    _wait(browser, lambda d: d.find_element(By.ID, "status").text.startswith("3 runs match"))
    cells = {tr.find_element(By.CSS_SELECTOR, "a.open").text: tr.find_elements(By.TAG_NAME, "td")[8]
             for tr in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")}  # fmt: skip
    assert cells["a-cut"].text == "not judged"
    # newcomer (stop 29): the exported list wrote temperature 0.0 as "0", the served list and run pages as "0.0"
    assert {tr.find_elements(By.TAG_NAME, "td")[2].text for tr in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")} == {
        "0.0"
    }
    assert cells["a-cut"].get_attribute("title") == f"checks not judged (the run did not finish): file_exists, {UNJUDGED_CHECK}"
    assert (cells["b-fail"].text, cells["b-fail"].get_attribute("title")) == ("file_exists", "")
    assert not browser.find_elements(By.CSS_SELECTOR, "#runs b")  # the check name's markup stays text
    browser.find_element(By.CSS_SELECTOR, 'th a[data-sort="failed_checks"]').click()
    assert _listed(browser) == ["a-cut", "c-pass", "b-fail"]  # the interrupted run counts 0, ties in start order
    browser.find_element(By.CSS_SELECTOR, 'th a[data-sort="failed_checks"]').click()  # descending
    assert _listed(browser) == ["b-fail", "a-cut", "c-pass"]
    Select(browser.find_element(By.ID, "f-check")).select_by_value("file_exists")
    browser.find_element(By.ID, "apply").click()
    assert _listed(browser) == ["b-fail"]
    # a check that failed only in the interrupted run is not offered: choosing it showed 0 runs
    assert [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "f-check")).options] == ["", "file_exists"]
    browser.get((tmp_path / "site" / "runs" / "a-cut.html").as_uri())
    body = _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body")).text
    assert f"checks not judged (the run did not finish): file_exists, {UNJUDGED_CHECK}" in body
    assert "failed checks" not in body and body.count("FAIL (not judged)") == 2


def test_exported_list_does_not_judge_a_run_stopped_before_any_check_ran(browser, tmp_path):
    """list.js showed an empty checks cell for a run interrupted at turn 0 (no check ran) and for a run with no end row;
    like the served list (tests/test_viewer.py) it says "not judged" for every run whose outcome is not scored."""
    from selenium.webdriver.common.by import By

    with Ledger(tmp_path / "l.sqlite") as ledger:
        add_run(ledger, "a-cut0", model=SMALL, repetition=0, outcome="interrupted", turns=[], checks=[])
        add_run(ledger, "b-open", model=SMALL, repetition=1, outcome=None)
        add_run(ledger, "c-pass", model=SMALL, repetition=2, outcome="pass")
    export_site(tmp_path / "l.sqlite", tmp_path / "site")
    browser.get((tmp_path / "site" / "index.html").as_uri())
    _wait(browser, lambda d: d.find_element(By.ID, "status").text.startswith("3 runs match"))
    cells = {tr.find_element(By.CSS_SELECTOR, "a.open").text: tr.find_elements(By.TAG_NAME, "td")[8]
             for tr in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")}  # fmt: skip
    title = "checks not judged (the run did not finish)"
    assert [(cells[r].text, cells[r].get_attribute("title")) for r in ("a-cut0", "b-open")] == [("not judged", title)] * 2
    assert (cells["c-pass"].text, cells["c-pass"].get_attribute("title")) == ("", "")


def test_exported_list_names_checks_named_like_object_properties(browser, tmp_path):
    """Check names are the scenario's: the cell list.js builds (and its "not judged" title) names each as the served
    list does (``counted``). Names such as ``constructor`` or ``__proto__`` were dropped: list.js counted them in a
    plain object, where they are already properties (red team)."""
    from selenium.webdriver.common.by import By

    judged, unjudged = ["constructor", "constructor", "__proto__", "x"], ["toString", "hasOwnProperty"]
    with Ledger(tmp_path / "l.sqlite") as ledger:
        add_run(ledger, "a-cut", model=SMALL, repetition=0, outcome="interrupted",
                checks=[{"check": name, "passed": False, "detail": ""} for name in unjudged])  # fmt: skip
        add_run(ledger, "b-fail", model=SMALL, repetition=1, outcome="task_failed",
                checks=[{"check": name, "passed": False, "detail": ""} for name in judged])  # fmt: skip
    export_site(tmp_path / "l.sqlite", tmp_path / "site")
    browser.get((tmp_path / "site" / "index.html").as_uri())
    _wait(browser, lambda d: d.find_element(By.ID, "status").text.startswith("2 runs match"))
    cells = {tr.find_element(By.CSS_SELECTOR, "a.open").text: tr.find_elements(By.TAG_NAME, "td")[8]
             for tr in browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")}  # fmt: skip
    assert cells["b-fail"].text == counted(judged) == "constructor \u00d72, __proto__, x"
    assert cells["a-cut"].get_attribute("title") == "checks not judged (the run did not finish): toString, hasOwnProperty"


def test_hostile_output_never_runs_in_the_browser(browser, tmp_path):
    from selenium.webdriver.common.by import By

    path = build_hostile_ledger(tmp_path)
    with Ledger(path, readonly=True) as ledger:
        run_id = ledger.runs()[0].run_id
    export_site(path, tmp_path / "site")
    site = tmp_path / "site"
    with viewer_process("--ledger", str(path)) as url:
        pages = [url, f"{url}?mode=raw_json_in_content", f"{url}run/{run_id}", (site / "index.html").as_uri(),
                 (site / "runs" / f"{run_id}.html").as_uri()]  # fmt: skip
        for n, page in enumerate(pages):
            run_page = n in (2, 4)
            browser.get(page)
            _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#runs tbody tr, #outcome"))
            body = browser.find_element(By.TAG_NAME, "body").text
            assert browser.execute_script("return window.__pwned") is None, page
            assert "pwned" not in browser.title, page
            assert not browser.find_elements(By.CSS_SELECTOR, "main img, main svg, main script, a[href^='javascript']"), page
            assert HOSTILE_LABEL in body and "<img src=x onerror=window.__pwned=7>.jsonl" in body, page  # shown as text
            if run_page:
                assert HOSTILE_TEXT in body and HOSTILE_NAME in body and "</script><script>document.title='pwned'" in body
            _shot(browser, tmp_path, f"hostile-{n}")
