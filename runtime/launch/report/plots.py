"""The report's plots of a run's step lines and reports, one function per picture.

Each takes the run's data and returns a figure, or raises :class:`NoData` saying what it
would need; the page shows that sentence in the picture's place. A plot that would only
repeat another for this run (per data source, with one source; pass@k, with one sample
per prompt) raises :class:`NothingToAdd` instead, and is left out without a note. Figures
are built on matplotlib's object API (no pyplot): no global state, no display, safe in any
process.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import cycle
from typing import Any

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator

from .run_files import RunData
from .style import role_colour
from .validation import largest_k, number, pass_ks, source_metric, sources

__all__ = ["PLOTS", "NoData", "NothingToAdd", "Plot"]


class NoData(Exception):
    """A plot has nothing to draw; the message says what is missing."""


class NothingToAdd(Exception):
    """A plot would show only what another already does for this run; the message says
    which. Not a loss: the page leaves it out and lists nothing as missing."""


@dataclass(frozen=True, slots=True)
class Plot:
    name: str  # file name without .png
    title: str
    caption: str
    draw: Callable[[RunData], Figure]


def _series(lines: list[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    pairs = [
        (line[x], line[y])
        for line in lines
        if isinstance(line.get(x), int | float) and isinstance(line.get(y), int | float)
    ]
    return [a for a, _ in pairs], [b for _, b in pairs]


def _figure(panels: int) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(5.5 * panels, 3.6), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


def _need(data: RunData) -> None:
    if not data.steps:
        raise NoData("metrics.jsonl holds no step yet")


def reward(data: RunData) -> Figure:
    _need(data)
    fig, (by_time, by_version) = _figure(2)
    for ax, x_steps, x_val, label in (
        (by_time, "run_s", "run_s", "seconds of the run (scheduler time; restarts joined)"),
        (by_version, "policy_version", "version", "policy version"),
    ):
        x, y = _series(data.steps, x_steps, "reward_mean")
        ax.plot(x, y, color="0.6", linewidth=0.8, label="train batch reward")
        if len(y) >= 5:
            ax.plot(x, _smooth(y), color="#1f77b4", label="train reward (smoothed)")
        vx, vy = _series(data.validation, x_val, "val_reward")
        if vx:
            ax.plot(vx, vy, "o-", color="#d62728", label="validation reward")
        ax.set_xlabel(label)
        ax.set_ylabel("reward")
        ax.grid(alpha=0.3)
    by_time.legend(fontsize="small")
    return fig


# Data sources take these in the order the run names them; red is the overall validation
# reward's in every picture, black the overall curve beside the sources.
_SOURCE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
                   "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip


def validation_sources(data: RunData) -> Figure:
    names = sources(data.validation)
    if len(names) < 2:
        raise NothingToAdd("one data source: its curve is the Reward picture's validation")
    k = largest_k(data.validation[-1])
    panels = [("reward", "val_reward", "mean reward (mean@k)")]
    if k > 1:  # with one sample per prompt, pass@1 is the reward again
        panels.append((f"pass@{k}", f"val_pass@{k}", f"pass@{k}"))
    fig, axes = _figure(len(panels))
    for ax, (key, overall, label) in zip(axes, panels, strict=True):
        for name, colour in zip(names, cycle(_SOURCE_COLOURS), strict=False):
            x, y = _source_series(data.validation, name, key)
            ax.plot(x, y, "o-", color=colour, markersize=3, linewidth=1, label=name)
        x, y = _series(data.validation, "version", overall)
        # beneath the sources, which it would hide where one of them is the whole mean
        ax.plot(x, y, "o-", color="black", markersize=3, linewidth=2, label="all sources",
                zorder=1.5)  # fmt: skip
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("policy version")
        ax.set_ylabel(f"validation {label}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    return fig


def _source_series(
    lines: list[dict[str, Any]], source: str, key: str
) -> tuple[list[float], list[float]]:
    pairs = [
        (line["version"], value)
        for line in lines
        if number(line.get("version")) is not None
        and (value := source_metric(line, source, key)) is not None
    ]
    return [a for a, _ in pairs], [b for _, b in pairs]


def pass_at_k(data: RunData) -> Figure:
    sampled = [line for line in data.validation if largest_k(line) > 1]
    if not sampled:
        raise NothingToAdd("one sample per prompt: pass@1 is the Reward picture's validation")
    k = largest_k(sampled[-1])
    js = sorted({j for line in sampled for j in pass_ks(line)})
    fig, (by_version, by_j) = _figure(2)
    shades = matplotlib.colormaps["Blues"]
    for i, j in enumerate(js):
        x, y = _series(data.validation, "version", f"val_pass@{j}")
        shade = shades(0.4 + 0.6 * i / max(1, len(js) - 1))
        by_version.plot(x, y, "o-", color=shade, markersize=3, linewidth=1, label=f"pass@{j}")
    x, y = _series(data.validation, "version", "val_best_reward")
    by_version.plot(x, y, "s--", color="0.4", markersize=3, linewidth=1, label=f"best of {k}")
    x, y = _series(data.validation, "version", "val_reward")
    by_version.plot(x, y, "o-", color="#d62728", markersize=3, label=f"mean@{k}")
    by_version.xaxis.set_major_locator(MaxNLocator(integer=True))
    by_version.set_xlabel("policy version")
    by_version.set_ylabel("validation")
    by_version.legend(fontsize="small")
    ends = [sampled[0], sampled[-1]] if len(sampled) > 1 else sampled
    for line, colour in zip(ends, ("0.6", "#1f77b4"), strict=False):
        values = [(j, number(line.get(f"val_pass@{j}"))) for j in pass_ks(line)]
        points = [(j, v) for j, v in values if v is not None]
        by_j.plot([j for j, _ in points], [v for _, v in points], "o-", color=colour,
                  label=f"version {line.get('version')}")  # fmt: skip
    by_j.set_xscale("log", base=2)
    by_j.set_xticks(js, [str(j) for j in js])
    by_j.xaxis.set_minor_locator(NullLocator())
    by_j.set_xlabel("J (samples drawn per prompt)")
    by_j.set_ylabel("validation pass@J")
    by_j.legend(fontsize="small")
    for ax in (by_version, by_j):
        ax.grid(alpha=0.3)
    return fig


def staleness(data: RunData) -> Figure:
    _need(data)
    steps, means = _series(data.steps, "step", "staleness_mean")
    if not means:
        raise NoData("the step lines carry no staleness_mean")
    _, worst = _series(data.steps, "step", "staleness_max")
    fig, (hist, trend) = _figure(2)
    hist.hist(means, bins=min(30, max(5, len(set(means)) * 2)), color="#9467bd")
    hist.set_xlabel("mean staleness of a step's tokens (versions behind)")
    hist.set_ylabel("train steps")
    trend.plot(steps, means, label="mean", color="#9467bd")
    if worst:
        trend.plot(steps[: len(worst)], worst, label="max", color="0.5", linewidth=0.8)
    critic_steps, critic = _series(data.steps, "step", "critic_staleness_mean")
    if critic:  # a learned critic's values, in critic versions behind its step
        trend.plot(critic_steps, critic, label="critic (mean)", color="#2ca02c")
    limit = data.config.get("pipeline", {}).get("max_staleness")
    if isinstance(limit, int):
        trend.axhline(limit, color="#d62728", linestyle="--", linewidth=0.8, label="bound")
    trend.set_xlabel("train step")
    trend.set_ylabel("versions behind")
    trend.legend(fontsize="small")
    trend.grid(alpha=0.3)
    return fig


def roles(data: RunData) -> Figure:
    _need(data)
    rates: dict[str, list[tuple[float, float, float | None]]] = defaultdict(list)
    for line in data.steps:
        when = line.get("run_s")
        for role, r in (line.get("roles") or {}).items():
            if isinstance(when, int | float) and isinstance(r, dict):
                idle = r.get("waiting_for_work")
                rates[role].append((when, r.get("tokens_per_s", 0.0), idle))
    if not rates:
        raise NoData("the step lines carry no per-role activity (roles)")
    fig, (tokens, idle) = _figure(2)
    for role, points in sorted(rates.items()):
        colour = role_colour(role)
        tokens.plot([p[0] for p in points], [p[1] for p in points], label=role, color=colour)
        shown = [(p[0], p[2]) for p in points if isinstance(p[2], int | float)]
        idle.plot([p[0] for p in shown], [p[1] for p in shown], label=role, color=colour)
    tokens.set_ylabel("tokens/s (30 s window)")
    idle.set_ylabel("share of time waiting for work")
    idle.set_ylim(-0.02, 1.02)
    for ax in (tokens, idle):
        ax.set_xlabel("seconds of the run (scheduler time; restarts joined)")
        ax.grid(alpha=0.3)
    idle.legend(fontsize="small")
    return fig


def weights(data: RunData) -> Figure:
    if not data.weight_loads:
        raise NoData("weights.jsonl holds no weight load")
    fig, (per_version, rate) = _figure(2)
    for key, colour in (("transfer_s", "#1f77b4"), ("load_s", "#2ca02c"), ("stall_s", "#d62728")):
        x, y = _series(data.weight_loads, "version", key)
        per_version.scatter(x, [v * 1e3 for v in y], s=8, color=colour, label=key[:-2])
    legs = [
        (v["step"], v["published_to_loaded_s"])
        for line in data.steps
        for v in line.get("versions_loaded") or []
        if isinstance(v.get("published_to_loaded_s"), int | float)
    ]
    if legs:
        per_version.plot(
            [s for s, _ in legs],
            [t * 1e3 for _, t in legs],
            color="0.4",
            linewidth=0.8,
            label="published to loaded everywhere",
        )
    per_version.set_yscale("log")
    per_version.set_xlabel("weight version")
    per_version.set_ylabel("milliseconds")
    per_version.legend(fontsize="small")
    x, y = _series(data.weight_loads, "version", "mb_per_s")
    rate.scatter(x, y, s=8, color="#1f77b4")
    rate.set_xlabel("weight version")
    rate.set_ylabel("transfer MB/s (per generator)")
    for ax in (per_version, rate):
        ax.grid(alpha=0.3)
    return fig


def response_length(data: RunData) -> Figure:
    _need(data)
    steps, means = _series(data.steps, "step", "response_len_mean")
    if not means:
        raise NoData("the step lines carry no response_len_mean")
    _, longest = _series(data.steps, "step", "response_len_max")
    fig, (hist, trend) = _figure(2)
    hist.hist(means, bins=30, color="#ff7f0e")
    hist.set_xlabel("mean response length of a train batch (tokens)")
    hist.set_ylabel("train steps")
    trend.plot(steps, means, color="#ff7f0e", label="batch mean")
    if longest:
        trend.plot(steps[: len(longest)], longest, color="0.5", linewidth=0.8, label="batch max")
    budget = data.config.get("model", {}).get("max_new_tokens")
    if isinstance(budget, int):
        trend.axhline(
            budget, color="#d62728", linestyle="--", linewidth=0.8, label="max_new_tokens"
        )
    trend.set_xlabel("train step")
    trend.set_ylabel("tokens")
    trend.legend(fontsize="small")
    trend.grid(alpha=0.3)
    return fig


def mismatch(data: RunData) -> Figure:
    _need(data)
    steps, compared = _series(data.steps, "step", "logprob_mismatch_tokens")
    if not steps:
        raise NoData("the step lines carry no logprob_mismatch_tokens")
    fig, (gap, tokens) = _figure(2)
    drawn = False
    for key, label, colour in (
        ("logprob_mismatch_max", "|gap|, max", "0.5"),
        ("logprob_mismatch_mean", "|gap|, mean", "#1f77b4"),
        ("logprob_mismatch_kl", "k3 KL(behaviour || trainer)", "#d62728"),
        ("logprob_mismatch_log_ppl", "|log-ppl gap|", "#ff7f0e"),
    ):
        # A log scale: 1e-7 and 1e-2 are both meaningful; a gap of exactly 0 is not drawn.
        # (The log-perplexity gap is signed: its size is drawn, the headline gives its sign.)
        series = zip(*_series(data.steps, "step", key), strict=True)
        points = [(x, abs(y)) for x, y in series if y != 0]
        if points:
            x, y = zip(*points, strict=True)
            gap.plot(x, y, ".-", color=colour, label=label, markersize=3, linewidth=0.8)
            drawn = True
    if drawn:
        gap.set_yscale("log")
        gap.legend(fontsize="small")
    else:
        gap.text(0.5, 0.5, "no token was scored under the version\nthat sampled it",
                 ha="center", va="center", transform=gap.transAxes)  # fmt: skip
    gap.set_xlabel("train step")
    gap.set_ylabel("nats (log scale)")
    tokens.bar(steps, compared, color="#2ca02c", width=0.8)
    tokens.set_xlabel("train step")
    tokens.set_ylabel("tokens compared")
    for ax in (gap, tokens):
        ax.grid(alpha=0.3)
    return fig


def corrections(data: RunData) -> Figure:
    _need(data)
    if not any("offpolicy_weight_mean" in line for line in data.steps):
        raise NoData("the step lines carry no correction figures (offpolicy_weight_mean)")
    fig, (shares, weights) = _figure(2)
    for part, name, colour in (
        ("offpolicy", "off-policy", "#1f77b4"),
        ("engine", "engine", "#d62728"),
    ):
        for key, label, style in (
            ("truncated_frac", "tokens truncated", "-"),
            ("masked_frac", "tokens masked", "--"),
            ("rejected_frac", "sequences rejected", ":"),
        ):
            x, y = _series(data.steps, "step", f"{part}_{key}")
            if x:
                shares.plot(x, y, style, color=colour, linewidth=0.9, label=f"{name}: {label}")
        for key, label, style in (("weight_max", "max", ":"), ("weight_mean", "mean", "-")):
            x, y = _series(data.steps, "step", f"{part}_{key}")
            if x:
                weights.plot(x, y, style, color=colour, linewidth=0.9, label=f"{name}: {label}")
    shares.set_ylabel("share of trained tokens / sequences")
    weights.set_ylabel("weight before truncation (log scale)")
    weights.set_yscale("log")
    for ax in (shares, weights):
        ax.set_xlabel("train step")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    return fig


def entropy(data: RunData) -> Figure:
    _need(data)
    steps, nats = _series(data.steps, "step", "entropy")
    if not steps:
        raise NoData("the step lines carry no entropy (a run from before it was measured)")
    fig, (spread, clipped) = _figure(2)
    spread.plot(steps, nats, color="0.7", linewidth=0.8, label="per step")
    spread.plot(steps, _smooth(nats), color="#9467bd", label="smoothed")
    spread.set_xlabel("train step")
    spread.set_ylabel("mean token entropy (nats)")
    spread.legend(fontsize="small")
    for key, label, colour in (
        ("clip_frac", "ratio clipped", "#1f77b4"),
        ("dual_clip_frac", "dual clip bound", "#d62728"),
    ):
        x, y = _series(data.steps, "step", key)
        if x:
            clipped.plot(x, y, color=colour, linewidth=0.8, label=label)
    clipped.set_xlabel("train step")
    clipped.set_ylabel("share of trained tokens")
    clipped.legend(fontsize="small")
    for ax in (spread, clipped):
        ax.grid(alpha=0.3)
    return fig


def _smooth(values: list[float], window: int = 10) -> list[float]:
    out, run = [], 0.0
    for i, v in enumerate(values):
        run += v - (values[i - window] if i >= window else 0.0)
        out.append(run / min(i + 1, window))
    return out


PLOTS = (
    Plot("reward", "Reward", "Train batch reward (grey, smoothed in blue) and validation "
         "reward (red; with k samples per prompt, their mean: mean@k), against wall time and "
         "against the policy version.", reward),
    Plot("validation_sources", "Validation per data source", "Each data source's "
         "validation reward (mean@k) against the policy version, beside all sources' (black); "
         "with k samples per prompt, each source's pass@k too.", validation_sources),
    Plot("pass_at_k", "Validation mean@k and pass@k", "Per validation pass with k samples "
         "per prompt: pass@J for each J up to k (the chance that one of J samples is correct, "
         "estimated without bias from the k), the mean reward (mean@k) and the mean of each "
         "prompt's best reward, against the policy version; and pass@J against J at the "
         "first and the last validation.", pass_at_k),
    Plot("staleness", "Staleness", "How many versions behind the trainer the trained tokens "
         "were: per-step mean as a histogram, and its trend with the configured bound (and, "
         "with a learned critic, how many critic versions its values lagged its steps).",
         staleness),
    Plot("roles", "Throughput and idle time per role", "Tokens per second and the share of "
         "time each role's workers waited for work, over a sliding 30 s window.", roles),
    Plot("weights", "Weight versions", "Each generator's transfer, load and stall time per "
         "version (log scale), the time until every generator ran a version, and the "
         "transfer rate.", weights),
    Plot("response_length", "Response length", "Distribution of each train batch's mean "
         "response length, and its mean and longest response over the run.", response_length),
    Plot("mismatch", "Generator and trainer log-probs", "Per step, on the tokens logp scored "
         "under the very version that sampled them: the mean and max of |trainer logp - "
         "generator logp| and the k3 estimate of KL(behaviour || trainer) (log scale), and "
         "how many tokens were compared (none where logp reused the generator's log-probs).",
         mismatch),
    Plot("corrections", "Off-policy and engine corrections", "Per step and per part of the "
         "proximal/behaviour ratio (off-policy: tokens of older versions; engine: tokens of "
         "logp's own version): the share of tokens whose weight was truncated or that were "
         "masked, and of sequences rejected; and the weight's mean and max before truncation.",
         corrections),
    Plot("entropy", "Entropy and clipping", "The mean entropy of the sampling distribution "
         "over each step's trained tokens (a collapse towards 0 is the policy turning "
         "deterministic), and the share of tokens the PPO clip and the dual clip bound.",
         entropy),
)  # fmt: skip
