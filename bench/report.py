"""The results document (JSON) and its markdown rendering."""

from __future__ import annotations

from typing import Any

from bench.stats import CpuSplit, Figure

# Figures quoted in the issues, measured once on this kind of machine: context, not targets.
ISSUE_REFERENCES = {
    "pgbench lease cycle, 16 clients": "about 5,500 cycles/s (1,800 at 1 client)",
    "pgqueuer 1.6 dequeue+ack": "about 3,400 jobs/s; steady state ~4,300 (1 manager) / ~6,700 (5)",
    "pgqueuer batch enqueue": "about 45,000 jobs/s",
    "procrastinate 3.10 worker": "384 jobs/s at concurrency 1, 771 at 10",
    "before the worker rewrite": "SDK Worker 16 slots 279 items/s; queue-server work -- true 17 (1 slot) / 225 (16)",
}


def _ratio(
    name: str, num: Figure | None, den: Figure | None, threshold: float, detail: str
) -> dict[str, Any]:
    if num is None or den is None or den.median == 0:
        return {
            "target": name,
            "value": None,
            "threshold": threshold,
            "met": None,
            "detail": "not measured",
        }
    value = num.median / den.median
    return {
        "target": name,
        "value": round(value, 3),
        "threshold": threshold,
        "met": value >= threshold,
        "detail": f"{detail}: {num.median:,.0f} / {den.median:,.0f}",
    }


def _best(figs: dict[str, Figure], *keys: str) -> Figure | None:
    found = [figs[k] for k in keys if k in figs]
    return max(found, key=lambda f: f.median) if found else None


def _at_most(name: str, fig: Figure | None, threshold: float, detail: str) -> dict[str, Any]:
    return {
        "target": name,
        "value": round(fig.median, 2) if fig else None,
        "threshold": threshold,
        "met": (fig.median <= threshold) if fig else None,
        "detail": detail,
    }


def _worker_ratios(figs: dict[str, Figure]) -> list[dict[str, Any]]:
    """The targets of the worker rewrite: what users run against each peer at its best."""
    out: list[dict[str, Any]] = []
    pgq = _best(figs, "peer_dequeue_ack", "peer_dequeue_ack_m5")
    for kind, label in (("thread", "SDK Worker (threads)"), ("async", "SDK AsyncWorker")):
        out.append(
            _ratio(
                f"{label}, 16 slots >= 1.0x pgqueuer's best steady state",
                figs.get(f"sdk_{kind}_c16"),
                pgq,
                1.0,
                f"steady items/s / {pgq.label if pgq else 'pgqueuer'}",
            )
        )
        out.append(
            _ratio(
                f"{label}, 1 slot >= 2.0x procrastinate at concurrency 1",
                figs.get(f"sdk_{kind}_c1"),
                figs.get("procrastinate_c1"),
                2.0,
                "steady items/s / procrastinate steady jobs/s",
            )
        )
    out.append(
        _ratio(
            "queue-server work -- true, 16 slots >= 3.0x procrastinate at concurrency 10",
            figs.get("work_c16"),
            figs.get("procrastinate_c10"),
            3.0,
            "steady items/s / procrastinate steady jobs/s",
        )
    )
    out.append(
        _ratio(
            "queue-server work -- true, 1 slot >= 0.5x a bare loop (acquire, true, complete)",
            figs.get("work_c1"),
            figs.get("bare_loop_c1"),
            0.5,
            "steady items/s / bare loop items/s",
        )
    )
    for op in ("acquire", "complete"):
        fig = _best(figs, f"{op}_p50_ms_h10000")
        out.append(
            _at_most(
                f"{op} p50 at one worker <= 1.5 ms",
                fig,
                1.5,
                "1 unbatched worker, 10,000 history rows (the cost-growth phase)",
            )
        )
    return out


def _ratios(figs: dict[str, Figure], peak_rss: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    batched = [
        figs[k] for k in ("rest_batched_c1", "rest_batched_c4", "rest_batched_c16") if k in figs
    ]
    best_batched = max(batched, key=lambda f: f.median) if batched else None
    pgq = _best(figs, "peer_dequeue_ack", "peer_dequeue_ack_m5")
    out.append(
        _ratio(
            "batched REST >= 1.0x pgqueuer dequeue+ack (its best steady state)",
            best_batched,
            pgq,
            1.0,
            f"best batched REST ({best_batched.label if best_batched else '-'}) / pgqueuer",
        )
    )
    out += _worker_ratios(figs)
    for mode, threshold in (("batched", 0.6), ("unbatched", 0.25)):
        for c in (16, 4, 1):
            out.append(
                _ratio(
                    f"{mode} REST >= {threshold}x pgbench"
                    + (" (headline, 16 clients)" if c == 16 else f" ({c} clients)"),
                    figs.get(f"rest_{mode}_c{c}"),
                    figs.get(f"pgbench_c{c}"),
                    threshold,
                    f"REST {mode} c{c} items/s / pgbench c{c} cycles/s",
                )
            )
    out.append(
        _ratio(
            "batch enqueue REST >= 0.5x pgqueuer batch enqueue",
            figs.get("rest_enqueue_batch"),
            figs.get("peer_enqueue_batch"),
            0.5,
            "REST items/s / pgqueuer jobs/s",
        )
    )
    p99 = figs.get("wake_p99_ms")
    out.append(
        {
            "target": "wake-up p99 < 50 ms at 100 items/s",
            "value": round(p99.median, 2) if p99 else None,
            "threshold": 50.0,
            "met": (p99.median < 50.0) if p99 else None,
            "detail": "enqueue request sent -> lease read by the long-polling worker",
        }
    )
    acq = sorted(
        (int(k.rsplit("_h", 1)[1]), f) for k, f in figs.items() if k.startswith("acquire_p50_ms_h")
    )
    if len(acq) >= 2:
        small, large = acq[0], next((a for a in acq if a[0] == 1_000_000), acq[-1])
        value = large[1].median / small[1].median if small[1].median else 0.0
        out.append(
            {
                "target": "acquire p50 with 1M history <= 1.2x with 10k",
                "value": round(value, 3),
                "threshold": 1.2,
                "met": value <= 1.2,
                "detail": f"{large[0]:,} rows: {large[1].median:.2f} ms / {small[0]:,} rows: {small[1].median:.2f} ms",
            }
        )
    mb = peak_rss / 2**20
    out.append(
        {
            "target": "server peak RSS < 250 MB",
            "value": round(mb, 1),
            "threshold": 250.0,
            "met": mb < 250.0,
            "detail": "psutil, sum over the server's process tree, sampled every 0.2 s",
        }
    )
    return out


def build(
    *,
    run_figures: dict[str, Figure],
    cpu: dict[str, CpuSplit],
    extra: dict[str, Any],
    errors: dict[str, list[str]],
    machine: dict[str, Any],
    config: dict[str, Any],
    peak_rss: int,
    wall: float,
) -> dict[str, Any]:
    return {
        "machine": machine,
        "config": config,
        "wall_s": round(wall, 1),
        "figures": {k: f.as_json() for k, f in run_figures.items()},
        "ratios": _ratios(run_figures, peak_rss),
        "server_peak_rss_mb": round(peak_rss / 2**20, 1),
        "cpu_split": {k: v.as_json() for k, v in cpu.items()},
        "issue_references": ISSUE_REFERENCES,
        "errors": errors,
        **extra,
    }


def _fmt(value: float, unit: str) -> str:
    return f"{value:,.2f}" if unit == "ms" else f"{value:,.0f}"


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    c = doc["config"]
    lines = [
        "# queue-server benchmark results",
        "",
        f"Measured on {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gb']} GB, Python {m['python']},"
        f" embedded PostgreSQL {c['postgres']} with default settings; server: `queue-server serve"
        f" --workers {c['server_workers']}`; {c['reps']} repetition(s), median shown;"
        f" {'quick run' if c['quick'] else 'default run'}, scale {c['scale']}; wall {doc['wall_s']} s.",
        f"Load average at start: {m['load_average_at_start']}. The cores are shared with other"
        " work: expect noise of 10-30% between runs.",
        "",
        "## Figures",
        "",
        "| figure | median | unit | runs |",
        "| --- | ---: | --- | --- |",
    ]
    for f in doc["figures"].values():
        runs = ", ".join(_fmt(v, f["unit"]) for v in f["runs"])
        lines.append(f"| {f['label']} | {_fmt(f['median'], f['unit'])} | {f['unit']} | {runs} |")
    lines += [
        "",
        "## Targets (ratios in this run)",
        "",
        "| target | value | threshold | met | detail |",
        "| --- | ---: | ---: | --- | --- |",
    ]
    for r in doc["ratios"]:
        met = {True: "yes", False: "**no**", None: "-"}[r["met"]]
        value = "-" if r["value"] is None else r["value"]
        lines.append(f"| {r['target']} | {value} | {r['threshold']} | {met} | {r['detail']} |")
    lines += [
        "",
        f"Server peak RSS: {doc['server_peak_rss_mb']} MB."
        f" Batched completion: {doc.get('batched_completion', '-')}.",
        "",
        "## CPU split (percent of one core over the phase's wall time; 200% = both cores)",
        "",
        "| phase | wall s | server | PostgreSQL | load generator |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, s in doc["cpu_split"].items():
        lines.append(
            f"| {name} | {s['wall_s']} | {s['server_pct_of_core']}% | {s['postgres_pct_of_core']}%"
            f" | {s['loadgen_pct_of_core']}% |"
        )
    if "cost_growth" in doc:
        lines += [
            "",
            "## Cost growth (1 worker, unbatched)",
            "",
            "| history rows | acquire p99 ms | complete p99 ms | work_items total MB |",
            "| ---: | ---: | ---: | ---: |",
        ]
        for g in doc["cost_growth"]:
            lines.append(
                f"| {g['history_rows']:,} | {g['acquire_p99_ms']} | {g['complete_p99_ms']} | {g['work_items_total_mb']} |"
            )
    if "churn" in doc:
        ch = doc["churn"]
        lines += [
            "",
            "## Churn (batched, 16 workers)",
            "",
            f"{ch['items']:,} items cycled ({ch['fraction_of_hour_equivalent']}x an hour at 100 items/s)."
            f" Throughput per {ch['window_s']:.0f}s window: {ch['window_rates_items_s']} items/s;"
            f" last/first {ch['last_over_first']}. Peak dead tuples in work_items:"
            f" {ch['peak_dead_tuples_work_items']:,}. Autovacuum kept up: {'yes' if ch['autovacuum_kept_up'] else 'no'}.",
            "",
            "| table | live | dead | autovacuums | autoanalyzes | s since last autovacuum |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for t in ch["final"]:
            lines.append(
                f"| {t['table']} | {t['live']:,} | {t['dead']:,} | {t['autovacuums']} | {t['autoanalyzes']} | {t['since_last_autovacuum_s']} |"
            )
        if "table_mb" in ch:
            lines += [
                "",
                f"Table sizes under a retention of {ch['retention_s']:g}s (finished items and"
                " their ledgers deleted by the sweeper):",
                "",
                "| table | live rows once retention applies (t) | live rows at the end | MB then | MB at the end |",
                "| --- | ---: | ---: | ---: | ---: |",
            ]
            for name, size in ch["table_mb"].items():
                lines.append(
                    f"| {name} | {size.get('live', 0):,} ({size['at_s']}s) | {size.get('end_live', 0):,}"
                    f" | {size['mb']} | {size['end_mb']} |"
                )
    if "profile" in doc:
        lines += ["", "## Server profile (py-spy, 16 workers)"]
        for mode, p in doc["profile"].items():
            lines += [
                "",
                f"### {mode} ({p['samples']} samples)",
                "",
                "Self time by package: "
                + ", ".join(f"{n} {v}%" for n, v in p["self_by_package_pct"]),
                "",
                "| top self time | % |",
                "| --- | ---: |",
            ]
            lines += [f"| `{n}` | {v} |" for n, v in p["top_self_pct"][:12]]
            lines += ["", "| queue_server code, inclusive time | % |", "| --- | ---: |"]
            lines += [f"| `{n}` | {v} |" for n, v in p["top_inclusive_queue_server_pct"][:20]]
    lines += [
        "",
        "## References quoted in the issues (context only; ratios use this run's figures)",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in doc["issue_references"].items()]
    if doc["errors"]:
        lines += ["", "## Errors", ""]
        lines += [f"- {k}: {v}" for k, v in doc["errors"].items()]
    return "\n".join(lines) + "\n"
