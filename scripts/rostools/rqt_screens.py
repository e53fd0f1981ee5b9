#!/usr/bin/env python3
"""Start one rqt plugin (standalone, as `rqt --standalone PLUGIN` does), act on it as a
user would, and save screenshots of its window: called by scripts/rostools/rqt_check.sh, once per
screen, with .ros/env.sh and .ros/tools/env.sh sourced and DISPLAY on an Xvfb server.

    python3 scripts/rostools/rqt_screens.py SCREEN OUTDIR [--node /vision_preproc] [--batch-node /batch/vision_preproc]
    (--batch-node: the node whose status the monitor screen selects)

SCREEN is one of topic, plot, reconfigure, console, monitor. The steps run inside rqt's
own Qt event loop (a timer started once rqt's QApplication exists), touching the
plugin's widgets as a click or a keystroke would; each screenshot is the main window
(QWidget.grab), saved as an 8-bit palette PNG. A heartbeat timer (every 100 ms) measures
how long rqt's event loop is stalled at each step: what a user feels as a frozen window.
What each step saw goes to OUTDIR/rqt_<SCREEN>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import qt_gui.main
from python_qt_binding.QtCore import Qt, QTimer
from python_qt_binding.QtTest import QTest
from python_qt_binding.QtWidgets import QApplication, QLineEdit, QMainWindow
from rqt_gui.main import Main

PLUGINS = {
    "topic": "rqt_topic.topic.Topic",
    "plot": "rqt_plot.plot.Plot",
    "reconfigure": "rqt_reconfigure.param_plugin.ParamPlugin",
    "console": "rqt_console.console.Console",
    "monitor": "rqt_runtime_monitor.runtime_monitor.RuntimeMonitor",
}
WINDOW = (1200, 720)


class Session:
    def __init__(self, screen: str, out: Path, args):
        self.screen, self.out, self.args = screen, out, args
        self.report: dict = {"screen": screen, "plugin": PLUGINS[screen], "steps": [], "shots": []}
        self.last_beat = time.monotonic()
        self.max_stall = 0.0
        self.failed = None

    # ------------------------------------------------------------ helpers
    def beat(self) -> None:
        now = time.monotonic()
        self.max_stall = max(self.max_stall, now - self.last_beat - 0.1)
        self.last_beat = now

    def step(self, what: str, **facts) -> None:
        entry = {"t": round(time.monotonic() - self.t0, 1), "step": what,
                 "event_loop_max_stall_s": round(self.max_stall, 2), **facts}
        self.report["steps"].append(entry)
        print(f"rqt_screens[{self.screen}] {entry}", flush=True)
        self.max_stall = 0.0

    def widget(self, class_name: str):
        found = [w for w in QApplication.allWidgets() if type(w).__name__ == class_name]
        if not found:
            raise RuntimeError(f"no {class_name} widget")
        return found[0]

    def window(self) -> QMainWindow:
        return [w for w in QApplication.topLevelWidgets() if isinstance(w, QMainWindow) and w.isVisible()][0]

    def shot(self, name: str) -> None:
        from PIL import Image

        path = self.out / f"{name}.png"
        self.window().grab().save(str(path))
        img = Image.open(path).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        img.save(path, optimize=True)
        self.report["shots"].append({"file": path.name, "bytes": path.stat().st_size})
        self.step(f"screenshot {path.name}", bytes=path.stat().st_size)

    def split(self, orientation, sizes) -> None:
        """Give the panes of the window's splitters of this orientation these heights."""
        from python_qt_binding.QtWidgets import QSplitter

        for sp in self.window().findChildren(QSplitter):
            if sp.orientation() == orientation and sp.count() == len(sizes):
                sp.setSizes(sizes)

    def type_into(self, edit: QLineEdit, text: str) -> None:
        edit.setFocus()
        edit.selectAll()
        QTest.keyClicks(edit, text)
        QTest.keyClick(edit, Qt.Key_Return)

    # ------------------------------------------------------------ screens
    def topic(self):
        w = self.widget("TopicWidget")
        yield 4.0
        items = w._tree_items
        col = w._column_index
        listed = sorted(n for n in items if "/" not in n.strip("/"))
        self.step("topics listed", topics=listed)
        watched = ("/timing", "/diagnostics", "/tensor/camera_info")
        for name in watched:
            items[name].setCheckState(0, Qt.Checked)
        yield 6.0
        rows = {n: {"rate": items[n].text(col["rate"]), "bandwidth": items[n].text(col["bandwidth"])} for n in watched}
        self.step("monitoring " + " ".join(watched), rows=rows)
        # What a user does next: tick the tensor to see its rate (collapsed), open the timing.
        items["/tensor"].setCheckState(0, Qt.Checked)
        items["/timing"].setExpanded(True)
        yield 8.0
        rows = {n: {"rate": items[n].text(col["rate"]), "bandwidth": items[n].text(col["bandwidth"])}
                for n in ("/tensor",) + watched}
        data = items.get("/tensor/data")
        self.step("monitoring /tensor too (collapsed)", rows=rows,
                  tensor_data_value_chars=len(data.text(col["value"])) if data is not None else None)
        self.shot("rqt_topic")
        # Then open the tensor: the data row shows the 4.9 MB array as text.
        items["/timing"].setExpanded(False)
        items["/tensor"].setExpanded(True)
        yield 8.0
        self.step("/tensor expanded (data shown)", tensor_data_value_chars=len(items["/tensor/data"].text(col["value"])))
        yield 4.0
        self.step("/tensor expanded, 4 s later")
        self.shot("rqt_topic_tensor")

    def plot(self):
        w = self.widget("PlotWidget")
        yield 3.0
        fields = ["upload_us", "preprocess_us", "conv_us", "download_us", "total_us", "age_us"]
        for f in fields:
            w.add_topic(f"/timing/{f}")
        self.step("added", topics=[f"/timing/{f}" for f in fields])
        yield 2.0
        # A 30 s wide time axis (autoscroll keeps the width the user sets).
        lo, hi = w.data_plot.get_xlim()
        w.data_plot.set_xlim([hi - 30.0, hi])
        yield 31.0
        w.data_plot._data_plot_widget._canvas.figure.tight_layout()
        w.data_plot._data_plot_widget._canvas.draw()
        yield 1.0
        self.shot("rqt_plot")

    def reconfigure(self):
        node = self.args.node
        sel = self.widget("NodeSelectorWidget")
        yield 4.0
        from python_qt_binding.QtCore import QItemSelectionModel
        from rqt_py_common.rqt_ros_graph import RqtRosGraph

        # The node list is read once at start-up, often before discovery has seen the node:
        # press Refresh, as a user does.
        QTest.mouseClick(sel._refresh_button, Qt.LeftButton)
        yield 3.0
        grns = {RqtRosGraph.get_upper_grn(i, ""): i for i in sel._enumerate_indexes()}
        self.step("nodes listed", nodes=sorted(grns))
        index = [i for g, i in grns.items() if g.strip("/") == node.strip("/")][0]
        sel.selectionModel.select(index, QItemSelectionModel.Select)  # a click on the node
        yield 4.0
        editors = {e.parameter.name: e for e in QApplication.allWidgets()
                   if type(e).__name__.endswith("Editor") and hasattr(e, "parameter")}
        self.step("node selected", node=node, parameters=len(editors))
        pad = editors["pad_value"]
        self.type_into(pad._paramval_lineedit, "[0.0, 0.0, 0.0]")
        yield 2.0
        self.step("pad_value typed", shown=pad._paramval_lineedit.text())
        size = editors["conv.size"]
        self.type_into(size._paramval_lineEdit, "4")
        yield 2.0
        self.step("conv.size typed", shown=size._paramval_lineEdit.text())
        # Tall enough for conv.size and pad_value (editors are in name order) and rqt's
        # message pane.
        self.window().resize(WINDOW[0], 990)
        self.split(Qt.Vertical, [860, 70])
        # Scroll the editors so that conv.size and pad_value are both in view.
        from python_qt_binding.QtWidgets import QScrollArea

        for area in self.window().findChildren(QScrollArea):
            bar = area.verticalScrollBar()
            bar.setValue(min(bar.maximum(), 160))
        yield 1.0
        self.shot("rqt_reconfigure")

    def console(self):
        # /rosout keeps records 10 s for late joiners (rcl's rosout QoS): rqt_check.sh makes
        # the node log while the console runs (parameter changes, a second node starting).
        self.window().resize(WINDOW[0], 900)
        console = self.widget("ConsoleWidget")
        console.table_splitter.setSizes([680, 200])  # the records above the filters
        yield 22.0
        table = console.table_view
        table.resizeColumnToContents(0)
        self.step("records", shown=table.model().rowCount())
        self.shot("rqt_console")

    def monitor(self):
        w = self.widget("RuntimeMonitorWidget")
        yield 5.0
        names = {}
        for i in range(w.tree_widget.topLevelItemCount()):
            top = w.tree_widget.topLevelItem(i)
            names[top.text(0)] = [top.child(j).text(0) for j in range(top.childCount())]
            top.setExpanded(True)
        self.step("statuses", tree=names)
        self.window().resize(WINDOW[0], 990)  # room for more of the selected status's keys
        # Select the batched node's status: its keys fill the right-hand pane.
        target = self.args.batch_node.strip("/")
        for i in range(w.tree_widget.topLevelItemCount()):
            top = w.tree_widget.topLevelItem(i)
            for j in range(top.childCount()):
                if top.child(j).text(0).startswith(target):
                    w.tree_widget.setCurrentItem(top.child(j))
        yield 3.0
        self.step("selected", html_chars=len(w.html_browser.toPlainText()),
                  text=w.html_browser.toPlainText()[:4000])
        self.shot("rqt_runtime_monitor")

    # ------------------------------------------------------------ driver
    def run(self, app) -> None:
        self.t0 = time.monotonic()
        heart = QTimer(app)
        heart.timeout.connect(self.beat)
        heart.start(100)
        gen = getattr(self, self.screen)()

        def advance():
            try:
                if not self.report["steps"]:
                    self.window().resize(*WINDOW)
                    self.window().move(0, 0)
                delay = next(gen)
            except StopIteration:
                self.finish(app)
                return
            except Exception:  # noqa: BLE001 - report what failed, then quit
                self.failed = traceback.format_exc()
                print(self.failed, file=sys.stderr, flush=True)
                self.finish(app)
                return
            QTimer.singleShot(int(delay * 1000), advance)

        QTimer.singleShot(1500, advance)

    def finish(self, app) -> None:
        self.report["failed"] = self.failed
        (self.out / f"rqt_{self.screen}.json").write_text(json.dumps(self.report, indent=1))
        # Closing rqt while its ROS thread runs can crash at exit (context invalid): the
        # screenshots and the report are written, so end the process here.
        sys.stdout.flush()
        import os
        os._exit(1 if self.failed else 0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("screen", choices=sorted(PLUGINS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--node", default="/vision_preproc")
    ap.add_argument("--batch-node", default="/batch/vision_preproc",
                    help="monitor: the node whose status is selected (its keys shown)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    session = Session(args.screen, args.out, args)
    create = qt_gui.main.Main.create_application

    def create_application(self, argv):
        app = create(self, argv)
        session.run(app)
        return app

    qt_gui.main.Main.create_application = create_application
    return Main().main(["rqt", "--standalone", PLUGINS[args.screen], "--clear-config"])


if __name__ == "__main__":
    sys.exit(main())
