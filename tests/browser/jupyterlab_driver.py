"""Drive a real JupyterLab in headless Chromium, the way a learner uses it.

``JupyterLabServer`` starts ``jupyter lab`` on 127.0.0.1 (free port, random token) with
Galata's test configuration (``jupyterlab.galata.configure_jupyter_server``: its in-page
helpers ``window.galata`` and the application as ``window.jupyterapp``), a temporary root
folder and temporary HOME / Jupyter / IPython / matplotlib directories, so a run never reads
or writes the user's configuration. Everything else is JupyterLab's default settings
(comms over subshells included).

``LabPage`` wraps a Playwright page: open a notebook, Run All, and read back what every
cell did, from the notebook model (outputs) and from the DOM (what was drawn). Waiting
is done with the application's own promises (``commands.execute`` resolves when the
cells have run) and ``window.galata`` helpers, never with fixed sleeps.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

CHROMIUM = Path(os.environ.get("DISTLAB_CHROMIUM", "/usr/bin/chromium"))
STARTUP_TIMEOUT_S = 120

_SERVER_CONFIG = """\
from jupyterlab.galata import configure_jupyter_server

configure_jupyter_server(c)  # Galata's helpers extension, window.jupyterapp, no browser
c.ServerApp.ip = "127.0.0.1"
c.ServerApp.port = {port}
c.ServerApp.port_retries = 0
c.ServerApp.root_dir = {root!r}
c.IdentityProvider.token = {token!r}  # Galata leaves the server open; this one asks a token
c.ServerApp.disable_check_xsrf = False
c.ServerApp.allow_root = True  # CI and containers run as root
"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def isolated_env(base: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the server and its kernels: every user-level directory under
    ``base``, this interpreter's bin first on PATH (kernels and ``torchrun`` use it)."""
    env = dict(os.environ)
    dirs = {
        "HOME": "home",
        "JUPYTER_CONFIG_DIR": "jupyter/config",
        "JUPYTER_DATA_DIR": "jupyter/data",
        "JUPYTER_RUNTIME_DIR": "jupyter/runtime",
        "JUPYTERLAB_SETTINGS_DIR": "jupyter/lab-settings",
        "JUPYTERLAB_WORKSPACES_DIR": "jupyter/lab-workspaces",
        "IPYTHONDIR": "ipython",
        "MPLCONFIGDIR": "matplotlib",
        "XDG_CONFIG_HOME": "xdg/config",
        "XDG_DATA_HOME": "xdg/data",
        "XDG_CACHE_HOME": "xdg/cache",
    }
    for name, sub in dirs.items():
        path = base / sub
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_CONFIG_PATH", None)
    env.update(extra or {})
    return env


class JupyterLabServer:
    """``jupyter lab`` in a subprocess; use as a context manager."""

    def __init__(self, root: Path, base: Path, env: dict[str, str] | None = None) -> None:
        self.root, self.base = root, base
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.env = isolated_env(base, env)
        self.log_path = base / "jupyterlab.log"
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lab_url(self, path: str = "") -> str:
        tree = f"/tree/{path}" if path else ""
        return f"{self.url}/lab{tree}?reset&token={self.token}"  # reset: no restored tabs

    def __enter__(self) -> Self:
        config = self.base / "jupyter_server_config.py"
        config.write_text(
            _SERVER_CONFIG.format(port=self.port, root=str(self.root), token=self.token)
        )
        log = self.log_path.open("wb")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", f"--config={config}"],
            env=self.env,
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_until_up()
        return self

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        status = f"{self.url}/api/status?token={self.token}"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited early:\n{self.log()}")
            try:
                with urllib.request.urlopen(status, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)  # polling a server that is starting, not waiting on the page
        raise TimeoutError(f"jupyter lab not up after {STARTUP_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def __exit__(self, *exc) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=10)


def copy_notebooks(source: Path, root: Path, names: list[str]) -> None:
    """Copy ``source/<name>/`` folders under ``root`` (JupyterLab autosaves what it runs)."""
    for name in names:
        shutil.copytree(source / name, root / name, ignore=shutil.ignore_patterns(".*"))


# -- in-page scripts: plain JavaScript evaluated with page.evaluate ---------------------------
_JS_OPEN = """async (path) => {
  const app = window.jupyterapp;
  const panel = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  await panel.context.ready;
  await panel.sessionContext.ready;
  await panel.sessionContext.session.kernel.info;
  app.shell.activateById(panel.id);
  return panel.id;
}"""

_JS_RUN = "async (command) => await window.jupyterapp.commands.execute(command)"

# After Run All stops at a cell's error: the index of the first code cell that did not run.
_JS_FIRST_NOT_RUN = """() => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  for (let i = 0; i < nb.widgets.length; i++) {
    const cell = nb.widgets[i];
    if (cell.model.type === 'code' && cell.model.sharedModel.getSource().trim()
        && cell.model.executionCount === null) return i;
  }
  return -1;
}"""

_JS_SELECT = """([id, index]) => {
  window.jupyterapp.shell.activateById(id);
  const nb = window.jupyterapp.shell.currentWidget.content;
  nb.activeCellIndex = index;
  nb.deselectAll();
}"""

# Wait for every cell's widgets to finish loading, with Galata's own helper.
_JS_WAIT_CELLS = """async (timeout) => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  for (const cell of nb.widgets) {
    cell.node.scrollIntoView({block: 'center'});
    await window.galata.waitForCellRun(cell, timeout);
  }
}"""

_JS_REPORT = """async () => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  const cells = [];
  for (let i = 0; i < nb.widgets.length; i++) {
    const cell = nb.widgets[i];
    if (cell.model.type !== 'code') continue;
    cell.node.scrollIntoView({block: 'center'});
    const outputs = cell.model.outputs.toJSON();
    const imgs = Array.from(cell.node.querySelectorAll('.jp-OutputArea-output img'));
    await Promise.all(imgs.map(img => img.decode().catch(() => null)));
    cells.push({
      index: i,
      source: cell.model.sharedModel.getSource(),
      execution_count: cell.model.executionCount,
      text: outputs.map(o => o.text || (o.data && o.data['text/plain']) || '')
                   .map(t => Array.isArray(t) ? t.join('') : t).join(''),
      errors: outputs.filter(o => o.output_type === 'error')
                     .map(o => ({ename: o.ename, evalue: o.evalue})),
      png_outputs: outputs.filter(o => o.data && o.data['image/png']
                                       && !o.data['application/vnd.jupyter.widget-view+json']).length,
      widget_outputs: outputs.filter(o => o.data
                                       && o.data['application/vnd.jupyter.widget-view+json']).length,
      images_drawn: imgs.filter(img => img.complete && img.naturalWidth > 0
                                       && img.naturalHeight > 0).length,
      widgets_drawn: cell.node.querySelectorAll('.jp-OutputArea-output .jupyter-widgets').length,
      widget_errors: Array.from(cell.node.querySelectorAll('.jp-OutputArea-output'))
                          .map(n => n.textContent)
                          .filter(t => /Error displaying widget|Loading widget\\.\\.\\./.test(t)),
    });
  }
  return cells;
}"""


@dataclass
class CellReport:
    index: int
    source: str
    execution_count: int | None
    text: str = ""  # the cell's streams and text/plain outputs, joined
    errors: list[dict] = field(default_factory=list)
    png_outputs: int = 0
    widget_outputs: int = 0
    images_drawn: int = 0
    widgets_drawn: int = 0
    widget_errors: list[str] = field(default_factory=list)


class LabPage:
    """A JupyterLab tab in Chromium."""

    def __init__(self, page, server: JupyterLabServer, artifacts: Path) -> None:
        self.page, self.server, self.artifacts = page, server, artifacts
        self.panel_id = ""

    def launch(self) -> None:
        self.page.goto(self.server.lab_url())
        self.page.wait_for_function("() => window.galata && window.jupyterapp")
        self.page.evaluate("async () => { await window.jupyterapp.restored; }")

    def open(self, path: str) -> None:
        self.panel_id = self.page.evaluate(_JS_OPEN, path)

    def run_all(self, cell_timeout_ms: int = 120_000) -> int:
        """Run All; where it stops at an error, go on from the next cell (as a learner
        who skips an exercise would). Returns how many times it stopped."""
        stops, tries = 0, {}
        self.page.evaluate(_JS_RUN, "notebook:run-all-cells")
        while (index := self.page.evaluate(_JS_FIRST_NOT_RUN)) >= 0:
            # ipykernel aborts execute requests that arrive just after an error, so a cell
            # may come back aborted (never run) once; three times in a row is a failure
            tries[index] = tries.get(index, 0) + 1
            if tries[index] > 3:
                cell = next(c for c in self.report() if c.index == index)
                raise AssertionError(f"cell {index} does not run: {cell}")
            stops += tries[index] == 1
            self.page.evaluate(_JS_SELECT, [self.panel_id, index])
            self.page.evaluate(_JS_RUN, "notebook:run-all-below")
        self.page.evaluate(_JS_WAIT_CELLS, cell_timeout_ms)
        return stops

    def cell(self, index: int):
        """The Playwright locator of cell ``index`` (counting every cell), scrolled into view
        (JupyterLab renders notebooks windowed: a cell far off screen may not be drawn)."""
        self.page.evaluate(
            "(i) => window.jupyterapp.shell.currentWidget.content.widgets[i]"
            ".node.scrollIntoView({block: 'center'})",
            index,
        )
        return self.page.locator(f'#{self.panel_id} .jp-Cell[data-windowed-list-index="{index}"]')

    def report(self) -> list[CellReport]:
        return [CellReport(**cell) for cell in self.page.evaluate(_JS_REPORT)]

    def close_and_shutdown(self) -> None:
        self.page.evaluate(
            """async () => {
              const app = window.jupyterapp;
              const panel = app.shell.currentWidget;
              await panel.sessionContext.shutdown();
              panel.dispose();
            }"""
        )

    def screenshot(self, name: str, locator=None) -> Path:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        path = self.artifacts / f"{name}.png"
        (locator or self.page).screenshot(path=str(path))
        return path
