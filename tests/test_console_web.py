"""The web console in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, through Selenium): served by the gateway at ``/``, it shows a
namespace's topics, a topic's DAG, segments and subscriptions; a split and a merge
through the page change the drawn DAG; a refusal shows the API's message. A failing
test saves a screenshot (build/screenshots/) and says where."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from test_gateway import free_port  # tests/ is on sys.path under pytest

from actors.gateway import start_gateway, stop_gateway
from clients import Producer, StreamConsumer

SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"
WAIT_S = 30


@pytest.fixture(scope="module")
def gateway(ray_cluster) -> Iterator[str]:
    port = free_port()
    url = start_gateway(port)
    yield url
    stop_gateway(port)


@pytest.fixture
def browser(request) -> Iterator[webdriver.Chrome]:
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver, "chromium or chromium-driver is missing: ./dev.sh test installs both"
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1000")
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield chrome
    finally:
        failed = getattr(request.node, "failed_call", False)
        if failed:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            shot = SCREENSHOTS / f"{request.node.name}.png"
            chrome.save_screenshot(str(shot))
            print(f"screenshot of the failing page: {shot}")
        chrome.quit()


def drawn(chrome: webdriver.Chrome) -> dict[str, str]:
    """Segment id → state, as drawn in the DAG."""
    return {
        g.get_attribute("data-segment"): g.get_attribute("data-state")
        for g in chrome.find_elements(By.CSS_SELECTOR, "#dag g.segment")
    }


def wait_until(chrome: webdriver.Chrome, condition, what: str):  # noqa: ANN001
    try:
        return WebDriverWait(chrome, WAIT_S, poll_frequency=0.2).until(lambda _: condition())
    except TimeoutException:
        raise AssertionError(f"the page never showed {what}; it shows {drawn(chrome)}") from None


def test_the_console_shows_a_topic_and_a_split_through_it_redraws_the_dag(
    gateway: str, browser: webdriver.Chrome, admin, unique: str
) -> None:
    namespace = "console/web"
    topic = f"topic://{namespace}/orders-{unique}"
    admin.create_scalable_topic(topic, 2)
    admin.create_subscription(topic, "billing")
    with Producer(topic) as producer:
        producer.send_batch([b"x"] * 200, keys=[f"k{i}" for i in range(200)]).result()
    consumer = StreamConsumer(topic, "billing", "reader-1")
    page = urllib.request.urlopen(gateway + "/", timeout=10)
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]

    browser.get(f"{gateway}/#ns={namespace}&topic={topic}")
    wait_until(browser, lambda: drawn(browser) == {"0": "ACTIVE", "1": "ACTIVE"}, "two segments")
    assert topic in browser.find_element(By.ID, "topic-name").text
    topics = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#topics a")]
    assert topic.removeprefix("topic://") in topics
    wait_until(
        browser,
        lambda: "reader-1" in browser.find_element(By.ID, "subscriptions").text,
        "the consumer and its segments",
    )
    records = [
        int(row.find_elements(By.TAG_NAME, "td")[5].text.replace(",", ""))
        for row in browser.find_elements(By.CSS_SELECTOR, "#segments tbody tr")
    ]
    assert sum(records) == 200, records

    browser.find_element(By.CSS_SELECTOR, "button[data-split='0']").click()
    split = {"0": "SEALED", "1": "ACTIVE", "2": "ACTIVE", "3": "ACTIVE"}
    wait_until(browser, lambda: drawn(browser) == split, "the split's children")
    assert admin.get_metadata(topic)["segments"]["0"]["childIds"] == [2, 3]

    for box in ("2", "3"):
        browser.find_element(By.CSS_SELECTOR, f"input[data-select='{box}']").click()
    browser.find_element(By.ID, "merge").click()
    wait_until(browser, lambda: drawn(browser).get("4") == "ACTIVE", "the merge's child")
    assert drawn(browser)["2"] == drawn(browser)["3"] == "SEALED"
    assert not browser.find_element(By.ID, "error").is_displayed()
    consumer.close()
    admin.delete_scalable_topic(topic)


def test_the_console_shows_the_apis_refusal(
    gateway: str, browser: webdriver.Chrome, admin, unique: str
) -> None:
    """A split of a sealed segment (refused by the API) is shown as the API's message,
    and the drawing does not change."""
    namespace = "console/web"
    topic = f"topic://{namespace}/refused-{unique}"
    admin.create_scalable_topic(topic, 2)
    browser.get(f"{gateway}/#ns={namespace}&topic={topic}")
    wait_until(browser, lambda: len(drawn(browser)) == 2, "two segments")
    admin.split_segment(topic, 0)  # behind the page's back: its split button is stale
    browser.find_element(By.CSS_SELECTOR, "button[data-split='0']").click()
    error = browser.find_element(By.ID, "error")
    wait_until(browser, error.is_displayed, "an error")
    assert "409" in error.text and "segment_not_active" in error.text, error.text
    assert admin.get_metadata(topic)["epoch"] == 1  # nothing more happened
    admin.delete_scalable_topic(topic)


def test_connect_with_an_http_port_serves_the_console(ray_cluster, capsys) -> None:
    from clients import connect

    port = free_port()
    try:
        connect(http_port=port)
        said = capsys.readouterr().out
        assert f"the web console is at http://127.0.0.1:{port}/" in said, said
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()
        assert "<title>Scalable Topics on Ray</title>" in page
        missing = urllib.request.Request(f"http://127.0.0.1:{port}/console/../pyproject.toml")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(missing, timeout=10)
        assert refused.value.code == 404
    finally:
        stop_gateway(port)
