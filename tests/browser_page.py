"""Render a page in a headless Chromium (Qt WebEngine, the `dev` extra's PyQt6-WebEngine) at a given width,
save a screenshot of the first screen, and print what a reader sees there as JSON: the decision card's state and
fields, where the card sits, the headings in order, and every identifier that wrapped.

    python tests/browser_page.py PAGE.html SHOT.png WIDTH [HEIGHT]

Run as a child of the test (Qt wants its application on a process's main thread). Never imported by pipeline/."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # no display
# root in a container: Chromium's sandbox cannot start; no GPU: software rendering
os.environ.setdefault("QTWEBENGINE_CHROMIUM_FLAGS", "--no-sandbox --disable-gpu --disable-dev-shm-usage")
os.environ.setdefault("QT_LOGGING_RULES", "*=false")

from PyQt6.QtCore import QSize, QTimer, QUrl  # noqa: E402
from PyQt6.QtWebEngineWidgets import QWebEngineView  # noqa: E402
from PyQt6.QtWidgets import QApplication  # noqa: E402

READ = """(() => {
  const card = document.getElementById('decision');
  const fields = {};
  if (card) card.querySelectorAll('dt').forEach(dt => {
    fields[dt.textContent.trim()] = dt.nextElementSibling ? dt.nextElementSibling.textContent.trim() : null;
  });
  const box = card ? card.getBoundingClientRect() : null;
  const lines = e => {  // the distinct line boxes its text takes: more than one is a wrap
    const range = document.createRange();
    range.selectNodeContents(e);
    return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size;
  };
  const wrapped = [...document.querySelectorAll('.id, th')].filter(e => lines(e) > 1).map(e => e.textContent.trim());
  return JSON.stringify({
    state: card ? card.querySelector('.state').textContent.trim() : null,
    state_colour: card ? getComputedStyle(card.querySelector('.state')).color : null,
    border: card ? getComputedStyle(card).borderTopColor : null,
    fields: fields,
    snippet: card && card.querySelector('pre') ? card.querySelector('pre').textContent : null,
    card: box ? {left: box.left, right: box.right, top: box.top, bottom: box.bottom} : null,
    headings: [...document.querySelectorAll('h2')].map(h => h.textContent.trim()),
    wrapped: wrapped,
    viewport: {width: window.innerWidth, height: window.innerHeight},
    page_width: document.documentElement.scrollWidth,
  });
})()"""


def main(page: str, shot: str, width: int, height: int) -> int:
    app = QApplication(sys.argv[:1])
    view = QWebEngineView()
    view.resize(QSize(width, height))
    found: dict = {}

    def read(text: str) -> None:
        found.update(json.loads(text))
        view.grab().save(shot)
        app.quit()

    def loaded(ok: bool) -> None:
        if not ok:
            found["error"] = "the page did not load"
            app.quit()
            return
        QTimer.singleShot(300, lambda: view.page().runJavaScript(READ, read))  # after the first layout

    view.loadFinished.connect(loaded)
    view.load(QUrl.fromLocalFile(os.path.abspath(page)))
    view.show()
    QTimer.singleShot(45_000, app.quit)
    app.exec()
    print(json.dumps(found))
    return 0 if found and "error" not in found else 1


if __name__ == "__main__":
    height = int(sys.argv[4]) if len(sys.argv) > 4 else 900
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), height))
