"""Screenshot of the ctuq napari plugin after a real reconstruction.

Opens napari with the ctuq widget docked, loads the Shepp–Logan sample
(64², 60 angles, 5 % noise), runs the full pipeline from the widget (FBP,
DIP+TV, EM over the prior hyperparameters, posterior samples) and saves the
window of the results viewer: the result layers as a grid (the three std
maps on one colour scale, reconstruction, truth, FBP, |error|), each with its
colour bar and name, the colour bars' unit in a caption and a scale bar in
mm. Needs an X display::

    QT_QPA_PLATFORM=xcb xvfb-run -a -s "-screen 0 1920x1200x24" \\
        .venv/bin/python scripts/screenshot_napari.py --out docs/napari_screenshot.png

Prints one JSON document (settings, timings, metrics) on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("screenshot_napari")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/napari_screenshot.png"))
    parser.add_argument("--sample", default="shepp_logan", choices=["shepp_logan", "digit"])
    parser.add_argument("--iterations", type=int, default=1000, help="DIP iterations")
    parser.add_argument("--em-steps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8, help="posterior samples per EM step")
    parser.add_argument("--predictive", type=int, default=64, help="samples for the std map")
    parser.add_argument("--width", type=int, default=1800)
    parser.add_argument("--height", type=int, default=1050)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)

    from qtpy.QtWidgets import QApplication

    from ctuq.app._widget import grid_of
    from ctuq.app.gui import dock_widget

    import napari
    from napari.utils.notifications import notification_manager

    viewer = napari.Viewer(title="ctuq", show=True)
    viewer.window.resize(args.width, args.height)
    widget = dock_widget(viewer)
    viewer.open_sample("ctuq", args.sample)
    widget.advanced_toggle.setChecked(True)
    widget.setting("dip.iterations").value = args.iterations
    widget.setting("uncertainty.em_steps").value = args.em_steps
    widget.setting("uncertainty.n_samples").value = args.samples
    widget.setting("uncertainty.predictive_samples").value = args.predictive
    app = QApplication.instance()

    t0 = time.perf_counter()
    if widget.run() is None:
        log.error("the widget refused to run: %s", widget.status_label.text())
        return 1
    while widget.is_running:
        app.processEvents()
        time.sleep(0.05)
        if time.perf_counter() - t0 > args.timeout:
            widget.cancel()
            log.error("timed out after %.0f s", args.timeout)
    wall = time.perf_counter() - t0
    result = widget.last_result
    if result is None:
        log.error("no result: %s", widget.status_label.text())
        return 1

    results = widget.results_viewer()
    results.window.resize(args.width, args.height)
    results.window._qt_window.raise_()
    grid = grid_of(results)
    grid.shape = (2, 4)
    grid.enabled = True
    results.layers.selection.active = results.layers[f"{args.sample} total std"]
    results.reset_view()
    for _ in range(20):
        app.processEvents()
        time.sleep(0.05)
    results.screenshot(canvas_only=False)        # a first full screenshot wakes the canvas
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results.screenshot(str(args.out), canvas_only=False)
    units = results.layers.units
    warnings = [str(n.message) for n in notification_manager.records
                if "units" in str(n.message).lower()]
    log.info("wrote %s", args.out)
    print(json.dumps({
        "out": str(args.out), "sample": args.sample, "wall_s": round(wall, 1),
        "settings": {"iterations": args.iterations, "em_steps": args.em_steps,
                     "samples": args.samples, "predictive": args.predictive},
        "metrics": {k: round(v, 4) for k, v in result.metrics.items()
                    if k in ("psnr", "psnr_fbp", "ssim", "coverage_1sigma", "coverage_2sigma",
                             "spearman_std_abs_error", "mean_std")},
        "timings_s": result.config.get("timings_s"),
        "layers": [lay.name for lay in results.layers],
        "world_units": None if units is None else [str(u) for u in units],
        "unit_warnings": warnings,
    }, indent=2))
    viewer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
