"""A report page opened from disk in headless Chromium (Debian's chromium and chromium-driver),
read back as a reader sees it: console errors, images, the gallery and the per-class table.

    python -m tests.browser PAGE [SCREENSHOT.png]   # prints what the page shows, as JSON
"""

import json
import pathlib
import shutil
import sys
import tempfile

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# As the machine notes advise: no background connections, which a closed network refuses.
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--window-size=1280,2000",
)  # fmt: skip
READ_PAGE = """
const cards = Array.from(document.querySelectorAll("#worst .card"));
const rows = Array.from(document.querySelectorAll("#classes tbody tr"));
return {
  images: Array.from(document.images).map((image) => [image.complete, image.naturalWidth]),
  cards: cards.map((card) => ({id: Number(card.dataset.id), true: card.dataset.true,
                               predicted: card.dataset.predicted})),
  pairs: document.querySelectorAll("#pairs .pair").length,
  classes: rows.map((row) => Array.from(row.cells).map((cell) => cell.textContent.trim())),
  headings: Array.from(document.querySelectorAll("#classes th")).map((th) => th.textContent),
};
"""


def read_page(page: str, screenshot: str | None = None) -> dict:
    """What Chromium shows of `page`: "errors" (console messages at SEVERE), "images"
    ([loaded, naturalWidth] each), the gallery's "cards", the number of confused "pairs", the
    per-class table's "classes" rows (cell texts) and "headings"; sorted rows after a
    click on the recall heading as "sorted_by_recall"."""
    if not (pathlib.Path(CHROMIUM).exists() and pathlib.Path(CHROMEDRIVER).exists()):
        raise RuntimeError(
            "no Chromium: apt-get install chromium chromium-driver (as .ci/run does)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(pathlib.Path(page).resolve().as_uri())
        shown = driver.execute_script(READ_PAGE)
        logs = driver.get_log("browser")
        shown["errors"] = [entry["message"] for entry in logs if entry["level"] == "SEVERE"]
        if screenshot:
            height = driver.execute_script("return document.body.scrollHeight")
            driver.set_window_size(1280, min(height + 40, 6000))
            driver.save_screenshot(screenshot)
        recall = shown["headings"].index("recall") if "recall" in shown["headings"] else None
        if recall is not None:
            driver.find_elements(By.CSS_SELECTOR, "#classes th")[recall].click()
            shown["sorted_by_recall"] = driver.execute_script(READ_PAGE)["classes"]
        return shown
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    found = read_page(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
    summary = {
        "errors": found["errors"],
        "images": len(found["images"]),
        "loaded": sum(1 for complete, width in found["images"] if complete and width > 0),
        "cards": len(found["cards"]),
        "pairs": found["pairs"],
        "classes": len(found["classes"]),
    }
    print(json.dumps(summary))
