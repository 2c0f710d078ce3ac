#!/usr/bin/env python3
"""Draws config/grafana/captf-dashboard.json from a recording of the manager's /metrics.

    python3 docs/dashboard/render.py RECORDING.jsonl OUT.png

RECORDING.jsonl holds one JSON object per read of /metrics ({"t": unix seconds, "text":
the OpenMetrics text}), as `cargo bench --bench dashboard` writes it. Each panel's
queries are evaluated on it by the small PromQL subset the dashboard uses (sum and max,
optionally by labels, of a selector; rate; histogram_quantile; a constant factor), with
the rate window shortened to 60 s so that a recording of minutes shows movement, and
drawn where the dashboard's grid puts the panel. Needs matplotlib (pip install
matplotlib). Not part of CI: the picture in docs/images is made with it by hand.
"""

import json
import math
import re
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.gridspec import GridSpec  # noqa: E402

RATE_WINDOW = 60.0
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def parse(text):
    """The samples of one read: {(name, frozenset(labels)): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        labels = frozenset((k, v) for k, _, v in LABEL.findall(m.group(3) or ""))
        try:
            out[(m.group(1), labels)] = float(m.group(4))
        except ValueError:
            pass
    return out


def matches(labels, matchers):
    d = dict(labels)
    for k, op, v in matchers:
        have = d.get(k, "")
        if op == "=" and have != v:
            return False
        if op == "!=" and have == v:
            return False
        if op == "=~" and not re.fullmatch(v, have):
            return False
        if op == "!~" and re.fullmatch(v, have):
            return False
    return True


def selector(expr):
    """name and matchers of `name{...}` (the dashboard's $job matcher is dropped)."""
    m = re.match(r'\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{([^}]*)\})?', expr)
    matchers = [(k, op, v) for k, op, v in LABEL.findall(m.group(3) or "") if k != "job"]
    return m.group(1), matchers


def split_top(s):
    """`f(a, b)` -> f, [a, b] at the top level."""
    f, rest = s.split("(", 1)
    depth, args, cur = 0, [], ""
    for ch in rest[:-1] if rest.endswith(")") else rest:
        if ch == "," and depth == 0:
            args.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    args.append(cur)
    return f.strip(), [a.strip() for a in args]


class Evaluator:
    def __init__(self, reads):
        self.reads = reads  # [(t, samples)]

    def vector(self, expr, i):
        """The instant vector of `expr` at read i: {labels: value}."""
        expr = expr.strip()
        m = re.match(r'^(.*\))\s*\*\s*([0-9.]+)$', expr)
        if m:
            return {k: v * float(m.group(2)) for k, v in self.vector(m.group(1), i).items()}
        m = re.match(r'^(sum|max)\s*(by\s*\(([^)]*)\))?\s*\((.*)\)$', expr, re.S)
        if m:
            op, by = m.group(1), [b.strip() for b in (m.group(3) or "").split(",") if b.strip()]
            inner = self.vector(m.group(4), i)
            groups = defaultdict(list)
            for labels, v in inner.items():
                d = dict(labels)
                groups[frozenset((b, d.get(b, "")) for b in by)].append(v)
            return {g: (sum(vs) if op == "sum" else max(vs)) for g, vs in groups.items()}
        if expr.startswith("histogram_quantile"):
            _, (q, inner) = split_top(expr)
            buckets = self.vector(inner, i)
            by = defaultdict(list)
            for labels, v in buckets.items():
                d = dict(labels)
                le = float(d.pop("le").replace("+Inf", "inf"))
                by[frozenset(d.items())].append((le, v))
            return {g: quantile(float(q), sorted(bs)) for g, bs in by.items()}
        if expr.startswith("rate"):
            _, (inner,) = split_top(expr)
            inner = re.sub(r'\[[^\]]*\]$', "", inner.strip())
            t, now = self.reads[i]
            j = i
            while j > 0 and t - self.reads[j - 1][0] <= RATE_WINDOW:
                j -= 1
            if j == i:
                return {}
            t0, then = self.reads[j]
            name, matchers = selector(inner)
            out = {}
            for (n, labels), v in now.items():
                if n == name and matches(labels, matchers):
                    before = then.get((n, labels), 0.0)
                    out[labels] = max(v - before, 0.0) / (t - t0)
            return out
        name, matchers = selector(expr)
        return {labels: v for (n, labels), v in self.reads[i][1].items()
                if n == name and matches(labels, matchers)}


def quantile(q, buckets):
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return math.nan
    rank, prev_le, prev_count = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / max(count - prev_count, 1e-9)
        prev_le, prev_count = le, count
    return prev_le


def legend(fmt, labels):
    d = dict(labels)
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: d.get(m.group(1), ""), fmt) or "value"


def main(recording, out, dashboard="config/grafana/captf-dashboard.json"):
    reads = []
    with open(recording) as f:
        for line in f:
            r = json.loads(line)
            reads.append((r["t"], parse(r["text"])))
    if not reads:
        sys.exit(f"{recording}: no reads")
    dash = json.load(open(dashboard))
    ev = Evaluator(reads)
    t0 = reads[0][0]
    xs = [(t - t0) / 60.0 for t, _ in reads]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dash["panels"])
    fig = plt.figure(figsize=(16, rows * 0.45))
    fig.patch.set_facecolor("#111217")
    gs = GridSpec(rows, 24, figure=fig, hspace=0, wspace=1.2, top=0.96, bottom=0.03)
    for p in dash["panels"]:
        g = p["gridPos"]
        # A row of the grid between panels, for the title and the axis below.
        ax = fig.add_subplot(gs[g["y"] + 1:g["y"] + g["h"] - 1, g["x"]:g["x"] + g["w"]])
        ax.set_facecolor("#181b1f")
        ax.set_title(p["title"], color="#d8d9da", fontsize=9, loc="left")
        for s in ax.spines.values():
            s.set_color("#2c3235")
        ax.tick_params(colors="#9fa7b3", labelsize=7)
        if p["type"] == "stat":
            last = len(reads) - 1
            total = 0.0
            for t in p["targets"]:
                total += sum(v for v in ev.vector(t["expr"], last).values() if not math.isnan(v))
            ax.text(0.5, 0.4, f"{total:g}", ha="center", va="center", fontsize=26,
                    color="#73bf69" if total == 0 else "#f2495c", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        for t in p["targets"]:
            series = defaultdict(lambda: [math.nan] * len(reads))
            for i in range(len(reads)):
                for labels, v in ev.vector(t["expr"], i).items():
                    series[labels][i] = v
            for labels, ys in sorted(series.items(), key=lambda kv: sorted(kv[0])):
                if all(math.isnan(y) or y == 0 for y in ys):
                    continue
                ax.plot(xs, ys, linewidth=1.2, label=legend(t.get("legendFormat", ""), labels))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper left", facecolor="#181b1f", labelcolor="#d8d9da",
                      edgecolor="#2c3235")
        ax.set_xlim(0, xs[-1])
        ax.set_xlabel("minutes", color="#9fa7b3", fontsize=7)
        ax.grid(color="#2c3235", linewidth=0.5)
    fig.suptitle(f"{dash['title']}: {len(reads)} reads of /metrics over "
                 f"{xs[-1]:.1f} minutes (cargo bench --bench dashboard)",
                 color="#d8d9da", fontsize=11, y=0.99)
    fig.savefig(out, dpi=90, facecolor=fig.get_facecolor(), bbox_inches="tight")
    print(f"{out}: {len(dash['panels'])} panels")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
