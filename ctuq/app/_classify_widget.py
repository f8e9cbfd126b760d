"""The "Classification benchmark" tab of the ctuq napari plugin.

Pick a data set (digits is bundled; Fashion-MNIST is read from Debian's
``dataset-fashion-mnist`` in ``/usr/share/datasets`` when no folder is given;
other MNIST-like sets need a folder of IDX/NPZ files), a model and the methods
(every method of :data:`ctuq.classify.bench.METHODS`: MAP, the linearised
Laplace variants, MC dropout, laplace-torch, and IVON: ``ivon``, its
Monte-Carlo predictive, and ``ivon+lla``, the linearised Laplace around the
IVON mean), press **Run**: the benchmark
(:func:`ctuq.classify.bench.run_benchmark`, one seed) runs in a
napari ``thread_worker`` with a progress bar and **Cancel**. The result shows

- the test images as an image stack ``"<dataset> test images"`` and a points
  layer ``"<dataset> predictions"`` with one point per image whose
  **features** are ``true``, ``predicted``, ``confidence`` and ``entropy``
  (nats) of the method chosen in *Show*; its text overlay prints them on
  every slice, and the image layer's metadata keeps the same table;
- the metrics table (method × accuracy, NLL, ECE (15 bins), Brier, OOD AUROC,
  NLL under rotation, seconds);
- the reliability diagram of every method (matplotlib).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
from qtpy.QtCore import QObject, Qt, Signal
from qtpy.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QFormLayout, QGridLayout,
                            QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton,
                            QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ctuq.errors import Cancelled, CtuqError

log = logging.getLogger(__name__)

#: Metrics table columns: (header, key, scale, decimals).
COLUMNS = (("accuracy %", "accuracy", 100, 1), ("NLL", "nll", 1, 3), ("ECE %", "ece", 100, 1),
           ("Brier", "brier", 1, 3), ("OOD AUROC %", "ood_auroc", 100, 1),
           ("NLL rotated", "rotation_nll", 1, 2), ("time s", "seconds", 1, 1))


class _Relay(QObject):
    progress = Signal(object)


class ClassifyWidget(QWidget):
    """Run the classification benchmark and show its results in napari.

    Parameters
    ----------
    napari_viewer : napari.Viewer

    Attributes
    ----------
    result : BenchResult or None
        The last finished benchmark.
    worker : napari worker or None
    config_overrides : dict
        Extra :class:`~ctuq.classify.bench.BenchConfig` fields applied
        to every run (tests use it for tiny runs).
    """

    def __init__(self, napari_viewer, parent=None):
        super().__init__(parent)
        self.viewer = napari_viewer
        self.result = None
        self.worker = None
        self.config_overrides: dict = {}
        self._busy = False
        self._cancel_event = threading.Event()
        self._relay = _Relay()
        self._relay.progress.connect(self._on_progress)
        self._build_ui()

    # -- layout ------------------------------------------------------------
    def _build_ui(self) -> None:
        from ctuq.classify.bench import DEFAULT_METHODS, METHODS

        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.dataset_combo = QComboBox()
        self.dataset_combo.addItems(["digits", "mnist", "fmnist", "kmnist"])
        form.addRow("Data set", self.dataset_combo)
        row = QHBoxLayout()
        self.data_dir_edit = QLineEdit()
        self.data_dir_edit.setPlaceholderText(
            "IDX/NPZ folder (digits: none; fmnist: /usr/share/datasets if empty)")
        browse = QPushButton("…")
        browse.clicked.connect(self._browse)
        row.addWidget(self.data_dir_edit)
        row.addWidget(browse)
        form.addRow("Data folder", row)
        self.model_combo = QComboBox()
        self.model_combo.addItems(["mlp", "cnn"])
        form.addRow("Model", self.model_combo)
        self.prior_combo = QComboBox()
        self.prior_combo.addItems(["ard", "gprior"])
        form.addRow("Prior", self.prior_combo)
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(0, 10**6)
        form.addRow("Seed", self.seed_spin)
        self.epochs_spin = QSpinBox()
        self.epochs_spin.setRange(1, 10_000)
        self.epochs_spin.setValue(150)
        form.addRow("Training epochs", self.epochs_spin)
        self.n_train_spin = QSpinBox()
        self.n_train_spin.setRange(0, 10**6)
        self.n_train_spin.setSpecialValueText("all")
        form.addRow("Training subset", self.n_train_spin)
        layout.addLayout(form)

        grid = QGridLayout()
        self.method_checks = {}
        for i, m in enumerate(METHODS):
            box = QCheckBox(m)
            box.setChecked(m in DEFAULT_METHODS)
            grid.addWidget(box, i // 2, i % 2)
            self.method_checks[m] = box
        layout.addWidget(QLabel("Methods"))
        layout.addLayout(grid)

        buttons = QHBoxLayout()
        self.run_button = QPushButton("Run benchmark")
        self.run_button.clicked.connect(self.run)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        layout.addLayout(buttons)
        self.progress_bar = QProgressBar()
        layout.addWidget(self.progress_bar)
        self.status_label = QLabel("Digits are bundled; press Run benchmark.")
        self.status_label.setWordWrap(True)
        layout.addWidget(self.status_label)

        show = QHBoxLayout()
        show.addWidget(QLabel("Show"))
        self.show_combo = QComboBox()
        self.show_combo.currentTextChanged.connect(self._show_method)
        show.addWidget(self.show_combo, 1)
        layout.addLayout(show)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels([c[0] for c in COLUMNS])
        self.table.setMinimumHeight(150)
        layout.addWidget(self.table)

        from matplotlib.backends.backend_qtagg import FigureCanvasQTAgg
        from matplotlib.figure import Figure

        self.figure = Figure(figsize=(4, 3.2))
        self.canvas = FigureCanvasQTAgg(self.figure)
        self.canvas.setMinimumHeight(240)
        layout.addWidget(self.canvas)
        layout.addStretch(1)

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Folder with the IDX/NPZ files")
        if folder:
            self.data_dir_edit.setText(folder)

    # -- settings ----------------------------------------------------------
    def methods(self) -> tuple[str, ...]:
        return tuple(m for m, box in self.method_checks.items() if box.isChecked())

    def bench_config(self):
        """The :class:`~ctuq.classify.bench.BenchConfig` of the form (plus overrides)."""
        from ctuq.classify.bench import BenchConfig

        cfg = BenchConfig(model=self.model_combo.currentText(),
                          prior=self.prior_combo.currentText(),
                          epochs=self.epochs_spin.value())
        return cfg.with_(**self.config_overrides) if self.config_overrides else cfg

    @property
    def is_running(self) -> bool:
        return self._busy

    # -- running -----------------------------------------------------------
    def run(self):
        """Start the benchmark in a worker thread; returns the worker (None on a bad form)."""
        from napari.qt.threading import thread_worker
        from napari.utils.notifications import show_error

        from ctuq.data.classification import load_classification
        from ctuq.classify.bench import parse_methods, run_benchmark

        if self._busy:
            return None
        try:
            methods = parse_methods(self.methods())
            cfg = self.bench_config()
        except CtuqError as err:
            show_error(f"ctuq: {err}")
            self.status_label.setText(f"Error: {err}")
            return None
        dataset = self.dataset_combo.currentText()
        data_dir = self.data_dir_edit.text().strip() or None
        seed = self.seed_spin.value()
        n_train = self.n_train_spin.value() or None
        relay, cancel = self._relay, self._cancel_event
        cancel.clear()

        def progress(stage, step, total, message=""):
            relay.progress.emit((stage, int(step), int(total), str(message)))

        def job():
            import torch

            # the small networks run fastest single-threaded (set in the worker thread,
            # where the benchmark's operations run)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                data = load_classification(dataset, data_dir, seed=seed, n_train=n_train)
                return "ok", run_benchmark(data, methods, cfg, seed=seed, progress=progress,
                                           cancel=cancel.is_set)
            except Cancelled:
                return "cancelled", None
            except CtuqError as err:
                return "error", str(err)
            finally:
                torch.set_num_threads(threads)

        worker = thread_worker(job, start_thread=False)()
        worker.returned.connect(self._on_returned)
        worker.errored.connect(lambda exc: self.status_label.setText(
            f"Failed: {type(exc).__name__}: {exc}"))
        worker.finished.connect(lambda: self._set_busy(False))
        self.worker = worker
        self._set_busy(True)
        self.status_label.setText(f"Running the {dataset} benchmark…")
        worker.start()
        return worker

    def cancel(self) -> None:
        if self._busy:
            self._cancel_event.set()
            self.status_label.setText("Cancelling…")

    def _set_busy(self, busy: bool) -> None:
        self._busy = busy
        self.run_button.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)

    def _on_progress(self, event) -> None:
        stage, step, total, message = event
        self.progress_bar.setRange(0, max(total, 1))
        self.progress_bar.setValue(min(step, max(total, 1)))
        self.status_label.setText(f"{stage}: {step}/{total} {message}"[:100])

    def _on_returned(self, out) -> None:
        from napari.utils.notifications import show_error

        status, value = out
        if status == "cancelled":
            self.status_label.setText("Cancelled.")
        elif status == "error":
            self.status_label.setText(f"Error: {value}")
            show_error(f"ctuq: {value}")
        else:
            self.show_result(value)

    # -- results -----------------------------------------------------------
    def show_result(self, result) -> None:
        """Fill the table, the reliability diagram and the image / prediction layers."""
        self.result = result
        names = list(result.methods)
        self.table.setRowCount(len(names))
        self.table.setVerticalHeaderLabels(names)
        for i, name in enumerate(names):
            m = dict(result.methods[name].metrics, seconds=result.methods[name].seconds)
            for j, (_, key, scale, dec) in enumerate(COLUMNS):
                item = QTableWidgetItem(f"{m[key] * scale:.{dec}f}")
                item.setTextAlignment(int(Qt.AlignRight | Qt.AlignVCenter))
                self.table.setItem(i, j, item)
        self.figure.clear()
        from ctuq.app.classify_figures import draw_reliability

        draw_reliability(self.figure.add_subplot(1, 1, 1),
                         {n: mr.reliability for n, mr in result.methods.items()})
        self.figure.tight_layout()
        self.canvas.draw_idle()
        self.show_combo.blockSignals(True)
        self.show_combo.clear()
        self.show_combo.addItems(names)
        pick = next((n for n in ("lla-sampled", "lla-exact") if n in names), names[0])
        self.show_combo.setCurrentText(pick)
        self.show_combo.blockSignals(False)
        self._show_method(pick)
        skipped = "; ".join(f"{k}: {v}" for k, v in result.skipped.items())
        self.status_label.setText(f"Done: {len(names)} methods on {result.dataset['name']}"
                                  + (f" (skipped {skipped})" if skipped else "") + ".")

    def prediction_table(self, method: str) -> dict:
        """``true``, ``predicted``, ``confidence``, ``entropy`` per test image for ``method``."""
        from ctuq.classify.metrics import predictive_entropy

        p = self.result.methods[method].test_probs
        return {"true": self.result.data.y_test.numpy().astype(int),
                "predicted": p.argmax(1).astype(int), "confidence": p.max(1),
                "entropy": predictive_entropy(p)}

    def _show_method(self, method: str) -> None:
        if self.result is None or method not in self.result.methods:
            return
        data = self.result.data
        name = self.result.dataset["name"]
        images = data.x_test[:, 0].numpy()
        feats = self.prediction_table(method)
        img_name, pts_name = f"{name} test images", f"{name} predictions"
        meta = {"ctuq_role": "classification_test", "method": method,
                "class_names": data.class_names, **{k: v.tolist() for k, v in feats.items()}}
        if img_name in self.viewer.layers:
            self.viewer.layers[img_name].data = images
            self.viewer.layers[img_name].metadata = meta
        else:
            self.viewer.add_image(images, name=img_name, colormap="gray", metadata=meta)
        coords = np.stack([np.arange(len(images)), np.zeros(len(images)),
                           np.zeros(len(images))], axis=1)
        text = {"string": "pred {predicted} ({confidence:.2f}), H={entropy:.2f}, true {true}",
                "size": 9, "color": "yellow", "anchor": "upper_left"}
        if pts_name in self.viewer.layers:
            self.viewer.layers.remove(pts_name)
        self.viewer.add_points(coords, name=pts_name, features=feats, text=text, size=0.5,
                               face_color="transparent", border_color="transparent",
                               metadata={"method": method})
