"""``asyncrl report``: a run directory's pictures and one self-contained HTML page.

Reads the run's files (run_files.py), draws each plot (plots.py) and the lease timeline
(timeline.py, gantt.py), and writes ``<run.dir>/report/``: one PNG per picture and
``index.html`` with all of them embedded, the headline figures, the evaluations of
checkpoints (evals.py) and the configuration.
Works on a run still going (it draws what is there) and on one from an earlier version
(each missing file is named, with what it would have shown).

Draws with matplotlib, which every install of asyncrl brings; nothing else of the run is
imported.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from asyncrl.runtime.contract.rundir import RunDir

    from .page import Section

__all__ = ["MissingExtra", "Report", "write_report"]


class MissingExtra(RuntimeError):
    """The report's plotting library is not installed."""


@dataclass(slots=True)
class Report:
    page: Path
    pictures: list[Path] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # files absent, pictures not drawn


def write_report(run_dir: Path, out: Path | None = None) -> Report:
    """Write the report of ``run_dir`` into ``out`` (default ``run_dir/report``)."""
    try:
        import matplotlib  # noqa: F401 - only to say what to install
    except ImportError:
        raise MissingExtra(
            "asyncrl report draws with matplotlib, which this environment lacks: "
            "pip install matplotlib (or install asyncrl again)"
        ) from None
    from .evals import evals_html
    from .gantt import draw_gantt
    from .headline import headline
    from .page import Section, render_page
    from .plots import PLOTS, NoData, NothingToAdd
    from .run_files import load_run
    from .timeline import timeline_from_trace

    data = load_run(run_dir)
    out = out or data.run.report
    out.mkdir(parents=True, exist_ok=True)
    timeline = timeline_from_trace(data.trace) if data.trace else None
    report = Report(out / "index.html", missing=list(data.missing))
    sections: list[Section] = []
    name = str(data.config.get("run", {}).get("name") or run_dir.name)
    if timeline is not None and timeline.rows:
        title = f"{name}: leases per worker"
        sections.append(
            _save(out, "gantt", "Lease timeline", _GANTT, draw_gantt(timeline, title), report)
        )
    elif timeline is not None:
        sections.append(Section("Lease timeline", "trace.json holds no lease yet", None))
    for plot in PLOTS:
        try:
            figure = plot.draw(data)
        except NothingToAdd:
            continue
        except NoData as why:
            report.missing.append(f"{plot.title}: {why}")
            sections.append(Section(plot.title, f"Not drawn: {why}.", None))
            continue
        sections.append(_save(out, plot.name, plot.title, plot.caption, figure, report))
    figures = headline(data, timeline)
    samples = _samples(data.run, data.config, report)
    evals = evals_html(data.evals, data.validation)
    page = render_page(
        f"asyncrl run {name}",
        figures,
        sections,
        report.missing,
        data.config_text,
        samples,
        evals,
    )
    report.page.write_text(page, encoding="utf-8")
    return report


def _samples(run: RunDir, config: dict, report: Report) -> str:
    """The samples section's HTML if the run dumped its rollouts, else ""."""
    from asyncrl.runtime.contract.rollout_dumps import read_rollouts

    from .samples import samples_html

    if not run.rollouts.is_dir():
        section = config.get("run")
        if isinstance(section, dict) and section.get("dump_rollouts") is True:
            report.missing.append(f"{run.rollouts.name}/: no sample of the run is shown")
        return ""
    return samples_html(read_rollouts(run.rollouts))


_GANTT = (
    "One row per worker, one bar per lease from its grant to its completion (hatched: "
    "failed or expired), coloured by role; black: a weight version's transfer and load on "
    "that worker; grey lines: train steps. Where generate bars run beside train bars, "
    "generation and training overlapped."
)


def _save(
    out: Path, name: str, title: str, caption: str, figure: Figure, report: Report
) -> Section:
    from .page import Section

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    png = buffer.getvalue()
    path = out / f"{name}.png"
    path.write_bytes(png)
    report.pictures.append(path)
    return Section(title, caption, png)
