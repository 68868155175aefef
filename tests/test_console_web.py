"""The web console in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, through Selenium): served by the gateway at ``/``, it shows a
namespace's topics, a topic's DAG, segments and subscriptions; a split and a merge
through the page change the drawn DAG; a refusal shows the API's message. A failing
test saves a screenshot (build/screenshots/) and says where."""

from __future__ import annotations

import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from test_gateway import free_port, gateway  # noqa: F401 - tests/ is on sys.path under pytest

from actors.gateway.server import stop_gateway
from actors.guard import REFRESH_S
from clients import Producer, ScalableTopicsAdmin, StreamConsumer

SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"
WAIT_S = 30


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
    """Segment id → state, as drawn in the DAG. Read in one script: the page redraws
    every 2 s, so elements found one call earlier may be gone by the next."""
    pairs = chrome.execute_script(
        "return Array.from(document.querySelectorAll('#dag g.segment'))"
        ".map(g => [g.dataset.segment, g.dataset.state])"
    )
    return dict(pairs)


def cells(chrome: webdriver.Chrome, css: str) -> list[str]:
    """The text of what ``css`` finds, in one script (see ``drawn``)."""
    script = "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent)"
    return chrome.execute_script(script, css)


def wait_until(chrome: webdriver.Chrome, condition, what: str):  # noqa: ANN001
    try:
        return WebDriverWait(chrome, WAIT_S, poll_frequency=0.2).until(lambda _: condition())
    except TimeoutException:
        raise AssertionError(f"the page never showed {what}; it shows {drawn(chrome)}") from None


def click(chrome: webdriver.Chrome, css: str) -> None:
    """Click what ``css`` finds; the page redraws its tables every 2 s, so an element
    found a moment ago may be gone: find it again."""

    def attempt() -> bool:
        try:
            chrome.find_element(By.CSS_SELECTOR, css).click()
        except (StaleElementReferenceException, NoSuchElementException):
            return False
        return True

    wait_until(chrome, attempt, f"{css} to click")


def test_the_console_shows_a_topic_and_a_split_through_it_redraws_the_dag(
    gateway: str,  # noqa: F811
    browser: webdriver.Chrome,
    admin,
    unique: str,
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
    topics = cells(browser, "#topics a")
    assert topic.removeprefix("topic://") in topics
    wait_until(
        browser,
        lambda: "reader-1" in browser.find_element(By.ID, "subscriptions").text,
        "the consumer and its segments",
    )
    records = [int(c.replace(",", "")) for c in cells(browser, "#segments tbody td:nth-child(6)")]
    assert sum(records) == 200, records

    click(browser, "button[data-split='0']")
    split = {"0": "SEALED", "1": "ACTIVE", "2": "ACTIVE", "3": "ACTIVE"}
    wait_until(browser, lambda: drawn(browser) == split, "the split's children")
    assert admin.get_metadata(topic)["segments"]["0"]["childIds"] == [2, 3]

    for box in ("2", "3"):
        click(browser, f"input[data-select='{box}']")
    click(browser, "#merge")
    wait_until(browser, lambda: drawn(browser).get("4") == "ACTIVE", "the merge's child")
    assert drawn(browser)["2"] == drawn(browser)["3"] == "SEALED"
    assert not browser.find_element(By.ID, "error").is_displayed()

    # into three parts, the three merged back in one operation, then a split at two hashes
    type_into(browser, "split-parts", "3")
    click(browser, "button[data-split='4']")
    wait_until(browser, lambda: drawn(browser).get("7") == "ACTIVE", "the three parts")
    for box in ("5", "6", "7"):
        click(browser, f"input[data-select='{box}']")
    click(browser, "#merge")
    wait_until(browser, lambda: drawn(browser).get("8") == "ACTIVE", "the merge of three")
    assert admin.get_metadata(topic)["segments"]["8"]["parentIds"] == [5, 6, 7]
    type_into(browser, "split-at", "2000, 2001")
    click(browser, "button[data-split='8']")
    wait_until(browser, lambda: drawn(browser).get("11") == "ACTIVE", "the split at two hashes")
    ranges = {i: admin.get_metadata(topic)["segments"][i]["hashRange"] for i in ("9", "10", "11")}
    assert ranges["10"] == {"start": 0x2000, "end": 0x2000}, ranges
    type_into(browser, "split-at", "0x9000")  # outside #9's range: the API's refusal shows
    click(browser, "button[data-split='9']")
    wait_until(browser, lambda: browser.find_element(By.ID, "error").is_displayed(), "an error")
    assert "409 inconsistent" in browser.find_element(By.ID, "error").text
    consumer.close()
    admin.delete_scalable_topic(topic)


def type_into(chrome: webdriver.Chrome, element_id: str, text: str) -> None:
    """Replace what the input ``element_id`` holds (it is not redrawn, unlike the tables)."""
    field = chrome.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(text)


def test_the_console_shows_the_apis_refusal(
    gateway: str,  # noqa: F811
    browser: webdriver.Chrome,
    admin,
    unique: str,
) -> None:
    """A split of a sealed segment (refused by the API) is shown as the API's message,
    and the drawing does not change."""
    namespace = "console/web"
    topic = f"topic://{namespace}/refused-{unique}"
    admin.create_scalable_topic(topic, 2)
    browser.get(f"{gateway}/#ns={namespace}&topic={topic}")
    wait_until(browser, lambda: len(drawn(browser)) == 2, "two segments")
    admin.split_segment(topic, 0)  # behind the page's back: its split button is stale
    click(browser, "button[data-split='0']")
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


def test_with_authentication_on_the_page_can_do_what_its_token_may(
    gateway: str,  # noqa: F811
    browser: webdriver.Chrome,
    admin,
    unique: str,
) -> None:
    """No token: refused (401) and nothing shown. A token that may only look: the DAG,
    and a split refused (403) with the drawing unchanged. An admin's token: the split."""
    from auth_support import policy_removed

    from runtime.auth import hash_token

    ops, looker = "console-ops-token-0123456789", "console-looker-token-0123456789"
    namespace = f"console/auth-{unique}"
    topic = f"topic://{namespace}/orders"
    admin.create_scalable_topic(topic, 2)
    with policy_removed():
        ScalableTopicsAdmin().load_auth({"tokens": [
            {"principal": "ops", "token": ops,
             "grants": [{"namespace": "*", "actions": ["admin"]}]},
            {"principal": "looker", "sha256": hash_token(looker),
             "grants": [{"namespace": namespace, "actions": ["lookup"]}]},
        ]})  # fmt: skip
        time.sleep(REFRESH_S + 0.5)  # every process applies it

        def sign_in(token: str) -> None:
            field = browser.find_element(By.ID, "token")
            field.clear()
            field.send_keys(token)
            click(browser, "#connect button")

        browser.get(f"{gateway}/#ns={namespace}")
        error = browser.find_element(By.ID, "error")
        wait_until(browser, lambda: "401" in error.text, "a refusal without a token")
        assert not browser.find_elements(By.CSS_SELECTOR, "#topics a")

        sign_in(looker)
        wait_until(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#topics a"), "topics")
        click(browser, "#topics a")
        wait_until(browser, lambda: len(drawn(browser)) == 2, "the looker's view of the DAG")
        click(browser, "button[data-split='0']")
        wait_until(browser, lambda: "403" in error.text, "the looker's split refused")
        time.sleep(1)
        assert drawn(browser) == {"0": "ACTIVE", "1": "ACTIVE"}

        sign_in(ops)
        click(browser, "#topics a")
        wait_until(browser, lambda: len(drawn(browser)) == 2, "the admin's view")
        click(browser, "button[data-split='0']")
        wait_until(browser, lambda: len(drawn(browser)) == 4, "the admin's split")
        ScalableTopicsAdmin(token=ops).delete_scalable_topic(topic)
