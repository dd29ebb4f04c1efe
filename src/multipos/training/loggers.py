"""Experiment loggers: W&B that never blocks (offline when its server cannot be reached), the resolved config and the
final metrics of a run, and a study's rendered table and figure.

What a ``logger=wandb`` run holds (``conf/logger/wandb.yaml``): the full resolved config (:func:`log_config`), the
training curves (``train/loss``, ``train/lr``, ``diag/…`` with ``callbacks=diagnostics``; ``stage<i>-`` prefixed in
multi-stage runs), the dev metric per epoch (``val/<metric>``), and after the final evaluation every set's metrics as
``test/<set>/<metric>`` in the run summary (:func:`log_final_metrics`, which also closes the run). Runs are grouped by
``experiment_name``. ``python -m multipos.report.render <sweep> --wandb`` adds a ``report`` run with the study's table
as a ``wandb.Table`` and its figure (:func:`log_report`). Offline runs are written to ``<run dir>/wandb/offline-run-*``
and uploaded later with ``wandb sync <that folder>``.
"""

from __future__ import annotations

import csv
import io
import os
import socket
import sys
from collections.abc import Mapping

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


def wandb_reachable(host: str = "api.wandb.ai", port: int = 443, timeout: float = 2.0) -> bool:
    """True if a TCP connection to the W&B server opens within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _offline(offline: bool | None) -> bool:
    """``offline`` as given, or (None) True when ``WANDB_MODE`` asks for it or the server is unreachable."""
    if offline is not None:
        return bool(offline)
    return os.environ.get("WANDB_MODE") in ("offline", "dryrun", "disabled") or not wandb_reachable()


def wandb_logger(project: str = "multipos", name: str | None = None, save_dir: str = ".", offline: bool | None = None,
                 **kwargs):
    """Lightning ``WandbLogger``; ``offline=None`` picks offline mode when the server is unreachable.

    ``kwargs`` go to ``WandbLogger`` and ``wandb.init`` (``group``, ``job_type``, ``tags``, ``prefix``…). Offline runs
    are written under ``<save_dir>/wandb`` and can be uploaded later with ``wandb sync``.
    """
    from lightning.pytorch.loggers import WandbLogger

    os.environ.setdefault("WANDB_INIT_TIMEOUT", "30")
    return WandbLogger(project=project, name=name, save_dir=save_dir, offline=_offline(offline), **kwargs)


def log_config(logger, record: dict) -> None:
    """Record the run's resolved config (``record``: plain nested dicts) in a W&B logger's run config (other loggers:
    nothing; the run directory's ``.hydra/config.yaml`` already holds it), so runs of a sweep can be filtered and
    grouped by any config key."""
    from lightning.pytorch.loggers import WandbLogger

    if isinstance(logger, WandbLogger):
        logger.log_hyperparams(record)


def _active_wandb_run():
    """The process's W&B run, or None (wandb is never imported here when no one else did)."""
    wandb = sys.modules.get("wandb")
    return getattr(wandb, "run", None) if wandb is not None else None


def log_final_metrics(results: Mapping[str, Mapping[str, float]]) -> None:
    """Log ``{set: {metric: value}}`` as ``test/<set>/<metric>`` (run summary and one last log row) to the active
    W&B run, if any, and finish it (a sweep's next run in the same process starts its own). No-op without W&B."""
    run = _active_wandb_run()
    if run is None:
        return
    flat = {f"test/{s}/{m}": float(v) for s, ms in results.items() for m, v in ms.items()}
    run.log(flat)
    run.summary.update(flat)
    run.finish()


def markdown_rows(md: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the first Markdown pipe table in ``md`` (cells stripped; separator line skipped).

    Raises ValueError when ``md`` holds no pipe table.
    """
    lines = [line.strip() for line in md.splitlines()]
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        raise ValueError("no Markdown table (lines starting with '|') in the rendered report")
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip("|").split("|")])
    body = [r for r in table[1:] if not all(set(c) <= set(":- ") for c in r)]
    return table[0], body


def wandb_image(fig):
    """The figure as a ``wandb.Image`` (one place for the conversion; tests stub it).

    The figure is rendered to PNG and handed over as a PIL image: ``wandb.Image(fig)`` itself goes
    through ``wandb.util.ensure_matplotlib_figure``, which reads ``matplotlib.pyplot`` without
    importing it and fails (``AttributeError``) when pyplot was never imported, as here.
    """
    import io

    import wandb
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    buf.seek(0)
    return wandb.Image(Image.open(buf))


def log_report(name: str, md: str, figure=None, project: str = "multipos", save_dir: str = ".",
               offline: bool | None = None, group: str | None = None) -> str:
    """Log a study's rendered table (the Markdown of :func:`multipos.report.render.render_sweep`) as ``wandb.Table``
    ``report/<name>`` and, when given, its matplotlib figure as ``report/<name>_figure``, in a W&B run of its own
    (job type ``report``, group ``group`` or ``name``). Offline as :func:`wandb_logger`. Returns the run's files folder.
    """
    import wandb


    header, rows = markdown_rows(md)
    mode = "offline" if _offline(offline) else "online"
    run = wandb.init(project=project, name=f"report-{name}", group=group or name, job_type="report", dir=save_dir,
                     mode=mode, reinit="finish_previous")
    payload = {f"report/{name}": wandb.Table(columns=header, data=rows)}
    if figure is not None:
        payload[f"report/{name}_figure"] = wandb_image(figure)
    run.log(payload)
    folder = str(run.dir)
    run.finish()
    return folder



class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV ``ExperimentWriter`` that keeps an existing ``metrics.csv`` (and its header) and appends, and
    never leaves the file part-written when the process is killed.

    Lightning rewrites the whole file in place (truncate, then write) whenever a new metric name appears, as at the
    first validation; a SIGKILL in that window left only the header, and the resumed run's curve began at the
    checkpoint (CI, 2026-12-04: ``assert [] == [0, 1, 2, 3, 4]`` in ``tests/training/test_resume.py``). Here the
    rewrite goes to ``metrics.csv.tmp`` and replaces the file in one ``os.replace``; a row cut short by a kill during an
    append is dropped when the file is reopened, so the next row does not run into it.
    """

    def _check_log_dir_exists(self) -> None:  # Lightning deletes the file here
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                text = f.read()
            if text and not text.endswith("\n"):  # the last row was cut short
                text = text[: text.rfind("\n") + 1]
                self._replace_with(text)
            self.metrics_keys = sorted(next(csv.reader(text.splitlines()[:1]), []))

    def _replace_with(self, text: str) -> None:
        tmp = self.metrics_file_path + ".tmp"
        with self._fs.open(tmp, "w", newline="") as f:
            f.write(text)
        self._fs.mv(tmp, self.metrics_file_path)  # a rename on a local disk: the old file or the new, never half

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        with self._fs.open(self.metrics_file_path, "r", newline="") as f:
            rows = list(csv.DictReader(f))
        out = io.StringIO(newline="")
        writer = csv.DictWriter(out, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
        self._replace_with(out.getvalue())


class ResumableCSVLogger(CSVLogger):
    """Lightning ``CSVLogger`` that **appends** to the ``metrics.csv`` of a resumed run (``logger=csv``).

    Lightning's own writer deletes an existing ``metrics.csv`` when it starts, so a run resumed after a preemption
    (same run directory, :mod:`multipos.train`) would lose the loss curve of everything before the interruption.
    Here the file is kept and new rows are appended; rows logged between the last checkpoint and the interruption
    appear twice with the same ``step`` (keep the last). ``resume=false`` removes the old logs first.
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment
