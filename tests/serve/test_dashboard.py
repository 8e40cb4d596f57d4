"""The dashboard in headless Chromium (Debian's chromium and chromium-driver, driven by Selenium)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from assay.serve import Client, MonitorSpec, build
from tests.requirements import require
from tests.serve.servers import ThreadServer, missing_program

TOKEN = "dashboard-token-0123456789"


@pytest.fixture(scope="module")
def browser():
    require("selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None:
        missing_program("chromium", "chromium")
    if driver_path is None:
        missing_program("chromedriver", "chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,1600"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dashboard")
    service = build(f"sqlite:///{folder / 'dashboard.db'}", token=TOKEN,
                    default=MonitorSpec("credit", 0.1, decision_column="approved"))
    with ThreadServer(service.app) as running:
        yield running
    service.close()


def screenshot(driver, name: str) -> None:
    """Keep a PNG of the page when ASSAY_SCREENSHOTS names a folder (to look at the dashboard)."""
    folder = os.environ.get("ASSAY_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def sign_in(driver, url):
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/")
    assert "/login" in driver.current_url  # the token is asked for first
    driver.find_element(By.NAME, "token").send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "form.login button").click()


def test_the_dashboard_shows_posted_violations_and_the_witness_pair(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    with Client(server.url, "credit", token=TOKEN) as client:
        client.post_records([{"age": 41, "income": 3.2, "debt": 0.5, "approved": "yes"},
                             {"age": 23, "income": 1.0, "debt": 0.9, "approved": "no"},
                             {"age": 41, "income": 3.25, "debt": 0.5, "approved": "no"}])  # within ε of the first
    sign_in(browser, server.url)
    wait = WebDriverWait(browser, 20)
    wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "table.monitors")))
    browser.find_element(By.LINK_TEXT, "credit").click()
    pair = wait.until(ready.presence_of_element_located((By.CSS_SELECTOR, "article.pair")))
    assert pair.get_attribute("data-decision") == "2"
    assert "#2 got no" in pair.text.replace("\n", " ") and "witness #0 got yes" in pair.text.replace("\n", " ")
    rows = {row.find_elements(By.TAG_NAME, "td")[0].text: row for row in pair.find_elements(By.CSS_SELECTOR, "table.compare tbody tr")}
    assert set(rows) == {"age", "income", "debt", "decision"}
    assert "differs" in rows["income"].get_attribute("class")        # 3.25 vs 3.2: highlighted
    assert "differs" not in rows["age"].get_attribute("class")       # equal: not highlighted
    cells = [td.text for td in rows["income"].find_elements(By.TAG_NAME, "td")]
    assert cells == ["income", "3.25", "3.2"]
    assert browser.find_element(By.ID, "count-flagged").text == "1"
    assert browser.find_elements(By.CSS_SELECTOR, ".plot svg rect.bar")
    # Live counts: a new violation shows up without reloading the page.
    with Client(server.url, "credit", token=TOKEN) as client:
        client.post_records([{"age": 23, "income": 1.05, "debt": 0.9, "approved": "yes"}])
    WebDriverWait(browser, 10).until(lambda driver: driver.find_element(By.ID, "count-flagged").text == "2")
    assert browser.find_element(By.ID, "fresh").is_displayed()
    screenshot(browser, "dashboard-credit")


def test_image_inputs_are_drawn_side_by_side(browser, server):
    from selenium.webdriver.common.by import By

    with Client(server.url, "digits", token=TOKEN) as client:
        client.create_monitor(epsilon=0.2, image_shape=[8, 8])
        digit = np.zeros((8, 8))
        digit[1:7, 3:5] = 1.0
        nudged = digit.copy()
        nudged[0, 0] = 0.15
        client.post_batch([digit.ravel(), nudged.ravel()], [1, 7])
    browser.get(f"{server.url}/monitors/digits")
    canvases = browser.find_elements(By.CSS_SELECTOR, "article.pair canvas.digit")
    assert len(canvases) == 3  # the decision, its witness, and where they differ
    # The script drew the pixels: the stroke white, the background black, the nudged corner dark grey.
    drawn = browser.execute_script(
        "return Array.from(document.querySelectorAll('canvas.digit')).map(function (c) {"
        " var d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        " return [c.width, c.height, d[4 * (3 * 8 + 3)], d[0]]; });")
    # The flagged decision (#1, nudged) first, its witness (#0) beside it; (0.15 − 0) / (1 − 0) · 255 rounds to 38.
    # The difference map is white where equal and the alert colour (red 194) where the pixels differ most.
    assert drawn == [[8, 8, 255, 38], [8, 8, 255, 0], [8, 8, 255, 194]]
    screenshot(browser, "dashboard-digits")
