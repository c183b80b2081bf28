"""The results document (JSON) and its markdown rendering."""

from __future__ import annotations

from typing import Any

from bench.stats import QUIET_SHARE, CpuSplit, Figure

# Figures quoted in the issues, measured once on this kind of machine: context, not targets.
ISSUE_REFERENCES = {
    "pgbench lease cycle, 16 clients": "about 5,500 cycles/s (1,800 at 1 client)",
    "pgqueuer 1.6 dequeue+ack": "about 3,400 jobs/s; steady state ~4,300 (1 manager) / ~6,700 (5)",
    "pgqueuer batch enqueue": "about 45,000 jobs/s",
    "procrastinate 3.10 worker": "384 jobs/s at concurrency 1, 771 at 10",
    "before the worker rewrite": "SDK Worker 16 slots 279 items/s; queue-server work -- true 17 (1 slot) / 225 (16)",
}


MET, UNMET, NOT_COMPARABLE, NOT_MEASURED = "met", "unmet", "not comparable", "not measured"


def _quantity(fig: Figure | None) -> str:
    return f"{_fmt(fig.median, fig.unit)} {fig.unit}" if fig else "-"


def _verdict(
    name: str,
    figures: list[Figure | None],
    value: float | None,
    threshold: float,
    ok: bool | None,
    detail: str,
    *,
    shown: str = "",
    reference: str = "",
    rivals: tuple[Figure, ...] = (),
) -> dict[str, Any]:
    """One target: met or unmet only when every figure it reads was measured on a quiet machine.

    A figure one of whose repetitions ran while other work took more than 10% of the
    machine makes the target "not comparable": neither met nor unmet. `rivals` are the
    figures a "best of" was chosen from: a loaded one may have lost only because it was
    slowed, so they must be quiet too.
    """
    entry: dict[str, Any] = {
        "target": name,
        "value": None if value is None else round(value, 3),
        "threshold": threshold,
        "met": ok,
        "status": NOT_MEASURED if ok is None else (MET if ok else UNMET),
        "detail": detail,
        "shown": shown,
        "reference": reference,
        "figures": [f.key for f in figures if f is not None],
    }
    if value is None or any(f is None for f in figures):
        entry.update(value=None, met=None, status=NOT_MEASURED, detail="not measured")
        return entry
    read = [f for f in figures if f is not None]
    loud = [f for f in read + [r for r in rivals if r not in read] if not f.quiet]
    if loud:
        entry.update(
            met=None,
            status=NOT_COMPARABLE,
            not_comparable_because=[f.why_not_quiet() for f in loud],
            not_comparable_short=[f.why_not_quiet(short=True) for f in loud],
        )
    return entry


def _ratio(
    name: str,
    num: Figure | None,
    den: Figure | None,
    threshold: float,
    detail: str,
    rivals: tuple[Figure, ...] = (),
) -> dict[str, Any]:
    """num / den >= threshold."""
    value = num.median / den.median if num and den and den.median else None
    return _verdict(
        name,
        [num, den],
        value,
        threshold,
        None if value is None else value >= threshold,
        f"{detail}: {num.median:,.0f} / {den.median:,.0f}" if num and den else detail,
        shown=_quantity(num),
        reference=f"{den.label} {_quantity(den)}" if den else "",
        rivals=rivals,
    )


def _at_most(name: str, fig: Figure | None, threshold: float, detail: str) -> dict[str, Any]:
    return _verdict(
        name,
        [fig],
        fig.median if fig else None,
        threshold,
        fig.median <= threshold if fig else None,
        detail,
        shown=_quantity(fig),
    )


def _best(figs: dict[str, Figure], *keys: str) -> tuple[Figure | None, tuple[Figure, ...]]:
    """The figure with the highest median among `keys`, and every one it was chosen from."""
    found = tuple(figs[k] for k in keys if k in figs)
    return (max(found, key=lambda f: f.median) if found else None), found


def _mode_targets(figs: dict[str, Figure], mode: str, label: str) -> list[dict[str, Any]]:
    """The targets of the phases that run in both modes of the server, for one of them."""

    def fig(key: str) -> Figure | None:
        return figs.get(f"{key}@{mode}")

    tag = f" [{label}]"
    out: list[dict[str, Any]] = []
    pgq, pgq_all = _best(figs, "peer_dequeue_ack", "peer_dequeue_ack_m5")
    batched, batched_all = _best(figs, *(f"rest_batched_c{c}@{mode}" for c in (1, 4, 16)))
    for kind, name in (("thread", "SDK Worker (threads)"), ("async", "SDK AsyncWorker")):
        c16, c1 = fig(f"sdk_{kind}_c16"), fig(f"sdk_{kind}_c1")
        out.append(
            _ratio(
                f"{name}, 16 slots >= 1.0x pgqueuer's best steady state{tag}",
                c16,
                pgq,
                1.0,
                "steady items/s / pgqueuer steady jobs/s",
                pgq_all,
            )
        )
        out.append(
            _ratio(
                f"{name}, 16 slots >= 0.9x the raw batched REST loop's best{tag}",
                c16,
                batched,
                0.9,
                "steady items/s / best batched REST items/s, same server",
                batched_all,
            )
        )
        out.append(
            _ratio(
                f"{name}, 16 slots >= 1.0x its 1 slot{tag}",
                c16,
                c1,
                1.0,
                "steady items/s at 16 slots / at 1 slot",
            )
        )
    for op in ("acquire", "complete"):
        out.append(
            _at_most(
                f"{op} p50 at one worker <= 0.8 ms{tag}",
                fig(f"{op}_p50_ms_c1"),
                0.8,
                "1 unbatched worker on a fresh queue (the lease-cycle phase)",
            )
        )
    for c, threshold in ((1, 0.25), (16, 0.15)):
        out.append(
            _ratio(
                f"unbatched REST lease cycles >= {threshold}x pgbench, {c} client"
                f"{'s' if c > 1 else ''}{tag}",
                fig(f"rest_unbatched_c{c}"),
                figs.get(f"pgbench_c{c}"),
                threshold,
                f"REST unbatched c{c} items/s / pgbench c{c} cycles/s",
            )
        )
    out.append(
        _ratio(
            f"batched REST lease cycles >= 0.6x pgbench, 16 clients{tag}",
            fig("rest_batched_c16"),
            figs.get("pgbench_c16"),
            0.6,
            "REST batched c16 items/s / pgbench c16 cycles/s",
        )
    )
    out.append(
        _ratio(
            f"batched REST lease cycles, best >= 1.0x pgqueuer's best steady state{tag}",
            batched,
            pgq,
            1.0,
            "best batched REST items/s / pgqueuer steady jobs/s",
            batched_all + pgq_all,
        )
    )
    return out


def _held_snapshot(figs: dict[str, Figure]) -> list[dict[str, Any]]:
    """The flow at the end of a held snapshot against the flow before it (issue 40)."""
    end, base = figs.get("held_snapshot_items_s_end"), figs.get("held_snapshot_items_s_base")
    p99_end = figs.get("held_snapshot_acquire_p99_ms_end")
    p99_base = figs.get("held_snapshot_acquire_p99_ms_base")
    value = p99_end.median / p99_base.median if p99_end and p99_base and p99_base.median else None
    return [
        _ratio(
            "held snapshot: SDK Worker items/s at the end of the hold >= 0.9x before it",
            end,
            base,
            0.9,
            f"{end.label if end else 'end of the hold'} / before it",
        ),
        _verdict(
            "held snapshot: acquire p99 at the end of the hold <= 2x before it",
            [p99_end, p99_base],
            value,
            2.0,
            None if value is None else value <= 2.0,
            f"{p99_end.label}: {p99_end.median:.2f} ms / {p99_base.median:.2f} ms"
            if p99_end and p99_base
            else "acquire p99, end of the hold / before it",
            shown=_quantity(p99_end),
            reference=f"{p99_base.label} {_quantity(p99_base)}" if p99_base else "",
        ),
    ]


def _ratios(
    figs: dict[str, Figure], modes: dict[str, str], peak_rss: dict[str, int]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for mode, label in modes.items():
        out += _mode_targets(figs, mode, label)
    out.append(
        _ratio(
            "REST batch enqueue >= 0.5x pgqueuer batch enqueue",
            figs.get("rest_enqueue_batch"),
            figs.get("peer_enqueue_batch"),
            0.5,
            "REST items/s / pgqueuer jobs/s, 500 per call",
        )
    )
    for per_commit, threshold in ((1, 0.2), (100, 0.08)):
        out.append(
            _ratio(
                f"enqueue in an application transaction, {per_commit} per commit >="
                f" {threshold}x a bare INSERT",
                figs.get(f"tx_enqueue_{per_commit}"),
                figs.get(f"tx_insert_{per_commit}"),
                threshold,
                f"order rows + queue_server.enqueue{'_many' if per_commit > 1 else ''}"
                f" items/s / order rows alone, {per_commit} per commit, one connection",
            )
        )
    # 16 application connections at once: no admission waits for another's commit.
    for per_commit, threshold in ((1, 0.5), (100, 0.3)):
        out.append(
            _ratio(
                f"enqueue in an application transaction, {per_commit} per commit, 16"
                f" connections >= {threshold}x a bare INSERT",
                figs.get(f"tx_enqueue_{per_commit}_c16"),
                figs.get(f"tx_insert_{per_commit}_c16"),
                threshold,
                f"order rows + queue_server.enqueue{'_many' if per_commit > 1 else ''}"
                f" items/s / order rows alone, {per_commit} per commit, 16 connections",
            )
        )
    out.append(
        _ratio(
            "queue-server work -- true, 16 slots >= 0.7x the spawn floor",
            figs.get("work_c16"),
            figs.get("spawn_floor_c16"),
            0.7,
            "steady items/s / 16 threads spawning true with no queue, items/s",
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
    p99 = figs.get("wake_p99_ms")
    out.append(
        _verdict(
            "wake-up p99 < 50 ms at 100 items/s",
            [p99],
            p99.median if p99 else None,
            50.0,
            p99.median < 50.0 if p99 else None,
            "enqueue request sent -> lease read by the long-polling worker",
            shown=_quantity(p99),
        )
    )
    out += _held_snapshot(figs)
    acq = sorted(
        (int(k.rsplit("_h", 1)[1]), f) for k, f in figs.items() if k.startswith("acquire_p50_ms_h")
    )
    if len(acq) >= 2:
        small, large = acq[0], next((a for a in acq if a[0] == 1_000_000), acq[-1])
        value = large[1].median / small[1].median if small[1].median else None
        out.append(
            _verdict(
                "acquire p50 with 1M history <= 1.2x with 10k",
                [large[1], small[1]],
                value,
                1.2,
                None if value is None else value <= 1.2,
                f"{large[0]:,} rows: {large[1].median:.2f} ms / {small[0]:,} rows:"
                f" {small[1].median:.2f} ms",
                shown=_quantity(large[1]),
                reference=f"{small[1].label} {_quantity(small[1])}",
            )
        )
    plain = figs.get("acquire_p50_ms_plain")
    for name, what in (
        ("rate", "a rate limit"),
        ("partitioned", "a rate limit per partition key (1,000 keys)"),
        ("ordered", "1,000 ordering keys"),
        ("waiting", "100,000 items waiting for a dependency"),
        ("fair", "fairness between 1,000 partition keys"),
    ):
        feature = figs.get(f"acquire_p50_ms_{name}")
        if not (plain and feature):
            continue
        value = feature.median / plain.median if plain.median else None
        out.append(
            _verdict(
                f"acquire p50 with {what} <= 1.5x the plain acquire",
                [feature, plain],
                value,
                1.5,
                None if value is None else value <= 1.5,
                f"{feature.median:.2f} ms / {plain.median:.2f} ms (the flow-control phase)",
                shown=_quantity(feature),
                reference=f"{plain.label} {_quantity(plain)}",
            )
        )
    for mode, rss in peak_rss.items():
        mb = rss / 2**20
        out.append(
            {
                "target": f"server peak RSS < 250 MB [{modes.get(mode, mode)}]",
                "value": round(mb, 1),
                "threshold": 250.0,
                "met": mb < 250.0,
                "status": MET if mb < 250.0 else UNMET,
                "detail": "psutil, sampled every 0.2 s: one process's RSS; several processes'"
                " PSS summed (a page they share counted once)",
                "shown": f"{mb:.1f} MB",
                "reference": "",
                "figures": [],
            }
        )
    return out


def _trust(cpu: dict[str, CpuSplit]) -> dict[str, Any]:
    """Whether every phase ran on a quiet machine, and which did not."""
    phases = [(name, p) for name, split in cpu.items() for p in split.phases]
    loud = [(name, p) for name, p in phases if not p.quiet]
    worst = max(phases, key=lambda x: x[1].share, default=None)
    return {
        "phases": len(phases),
        "quiet": not loud and bool(phases),
        "threshold_pct": round(100 * QUIET_SHARE),
        "highest_other_share_pct": round(100 * worst[1].share, 1) if worst else None,
        "highest_in": worst[0] if worst else None,
        "not_quiet": [{"phase": name, "why": p.describe()} for name, p in loud],
    }


def build(
    *,
    run_figures: dict[str, Figure],
    cpu: dict[str, CpuSplit],
    extra: dict[str, Any],
    errors: dict[str, list[str]],
    machine: dict[str, Any],
    config: dict[str, Any],
    peak_rss: dict[str, int],
    wall: float,
) -> dict[str, Any]:
    modes: dict[str, str] = dict(config.get("modes", {}))
    return {
        "machine": machine,
        "config": config,
        "wall_s": round(wall, 1),
        "trust": _trust(cpu),
        "figures": {k: f.as_json() for k, f in run_figures.items()},
        "ratios": _ratios(run_figures, modes, peak_rss),
        "server_peak_rss_mb": {modes.get(k, k): round(v / 2**20, 1) for k, v in peak_rss.items()},
        "cpu_split": {k: v.as_json() for k, v in cpu.items()},
        "issue_references": ISSUE_REFERENCES,
        "errors": errors,
        **extra,
    }


def _fmt(value: float, unit: str) -> str:
    return f"{value:,.2f}" if unit == "ms" else f"{value:,.0f}"


_VERDICT = {MET: "yes", UNMET: "**no**", NOT_COMPARABLE: "not comparable", NOT_MEASURED: "-"}


def _trust_line(doc: dict[str, Any]) -> str:
    t = doc["trust"]
    if t["quiet"]:
        return (
            f"**Quiet run**: in every one of its {t['phases']} phases, processes other than the"
            f" server, PostgreSQL and the benchmark used at most {t['threshold_pct']}% of the"
            f" machine (highest: {t['highest_other_share_pct']}%, {t['highest_in']})."
        )
    if not t["phases"]:
        return "**Not judged**: no phase was probed for other work."
    loud = len(t["not_quiet"])
    return (
        f"**Not a quiet run**: in {loud} of its {t['phases']} phases other work took more than"
        f" {t['threshold_pct']}% of the machine (highest: {t['highest_other_share_pct']}%,"
        f" {t['highest_in']}); every target reading a figure of such a phase is marked"
        ' "not comparable", neither met nor unmet.'
    )


def readme_table(doc: dict[str, Any]) -> list[str]:
    """The speed table of docs/speed.md, ready to paste: no figure of a phase that was not quiet."""
    c = doc["config"]
    kind = (
        "quick run (one short repetition: not for docs/speed.md)" if c["quick"] else "default run"
    )
    lines = [
        f"From the {kind} of {c.get('started_at', '?')} at `{c.get('commit', '?')}`,"
        f" load average {doc['machine']['load_average_at_start'][0]} at the start,"
        f" {'a quiet run' if doc['trust']['quiet'] else 'not a quiet run'};"
        f" medians of {c['reps']}; every figure in `bench/results/latest.md`.",
        "",
        "| target | queue-server | reference (same run) | value | verdict |",
        "| --- | ---: | --- | ---: | --- |",
    ]
    for r in doc["ratios"]:
        if r["status"] == NOT_COMPARABLE:
            why = "; ".join(r.get("not_comparable_short", []))
            lines.append(f"| {r['target']} | - | - | - | not comparable: {why} |")
            continue
        value = "-" if r["value"] is None else f"{r['value']:g}"
        verdict = {MET: "met", UNMET: "**not met**", NOT_MEASURED: "not measured"}[r["status"]]
        lines.append(
            f"| {r['target']} | {r.get('shown') or '-'} | {r.get('reference') or ''} | {value}"
            f" | {verdict} |"
        )
    return lines


def markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    c = doc["config"]
    modes = " and ".join(f"`{label}`" for label in c.get("modes", {}).values())
    lines = [
        "# queue-server benchmark results",
        "",
        _trust_line(doc),
        "",
        f"Measured on {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gb']} GB, Python {m['python']},"
        f" embedded PostgreSQL {c['postgres']} with default settings; {c['reps']} repetition(s),"
        f" median shown; {'quick run' if c['quick'] else 'default run'}, scale {c['scale']};"
        f" started {c.get('started_at', '?')} at `{c.get('commit', '?')}`; wall {doc['wall_s']} s.",
        f"Server modes: {modes}; the lease cycles and the SDK workers run in each (labelled), the"
        f" other phases under `serve --workers {c['server_workers']}`.",
        f"Load average at start: {m['load_average_at_start']}. A phase is quiet when processes"
        " other than the server, PostgreSQL and the benchmark's own took at most"
        f" {doc['trust']['threshold_pct']}% of the machine (cores x wall) during it.",
        "",
        "## Figures",
        "",
        "| figure | median | unit | runs | other work, % of the machine |",
        "| --- | ---: | --- | --- | --- |",
    ]
    for f in doc["figures"].values():
        runs = ", ".join(_fmt(v, f["unit"]) for v in f["runs"])
        other = ", ".join("?" if v is None else f"{v}" for v in f.get("other_share_pct", []))
        flag = "" if f.get("quiet", True) else " (not quiet)"
        lines.append(
            f"| {f['label']} | {_fmt(f['median'], f['unit'])} | {f['unit']} | {runs}"
            f" | {other}{flag} |"
        )
    lines += [
        "",
        "## Targets (ratios in this run)",
        "",
        "| target | value | threshold | met | detail |",
        "| --- | ---: | ---: | --- | --- |",
    ]
    for r in doc["ratios"]:
        met = _VERDICT[r["status"]]
        value = "-" if r["value"] is None else r["value"]
        detail = r["detail"]
        if r["status"] == NOT_COMPARABLE:
            detail += "; not comparable: " + "; ".join(r["not_comparable_because"])
        lines.append(f"| {r['target']} | {value} | {r['threshold']} | {met} | {detail} |")
    rss = ", ".join(f"{mode} {mb} MB" for mode, mb in doc["server_peak_rss_mb"].items())
    lines += [
        "",
        f"Server peak RSS: {rss}. Batched completion: {doc.get('batched_completion', '-')}.",
        "",
        "## Speed table",
        "",
        *readme_table(doc),
        "",
        "## CPU split (percent of one core over the phase's wall time; 200% = both cores)",
        "",
        "Other work: the machine's busy CPU (all but idle and iowait) less the server's, PostgreSQL's"
        " and the benchmark's own, as a share of the machine, per repetition.",
        "",
        "| phase | wall s | server | PostgreSQL | load generator | other work, % of the machine"
        " | load average (start -> end) |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for name, s in doc["cpu_split"].items():
        other = ", ".join(f"{v}" for v in s.get("other_share_pct", []))
        loads = ", ".join(f"{a} -> {b}" for a, b in s.get("load_average", []))
        flag = "" if s.get("quiet", True) else " (not quiet)"
        lines.append(
            f"| {name} | {s['wall_s']} | {s['server_pct_of_core']}% | {s['postgres_pct_of_core']}%"
            f" | {s['loadgen_pct_of_core']}% | {other}{flag} | {loads} |"
        )
    if "step_wall_s" in doc:
        lines += [
            "",
            "Wall time by step (s): "
            + ", ".join(f"{k} {v}" for k, v in doc["step_wall_s"].items())
            + ".",
        ]
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
    if "held_snapshot" in doc:
        lines += _held_snapshot_markdown(doc["held_snapshot"])
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


def _held_snapshot_markdown(hs: dict[str, Any]) -> list[str]:
    """The held-snapshot phase, window by window, and the hot tables at the release."""
    items, p99 = hs["items_s"], hs["acquire_p99_ms"]
    tables = list(hs["at_release"]["tables"])
    lines = [
        "",
        "## Held snapshot",
        "",
        f"{hs['flow']}. After {hs['baseline_s']:g} s of baseline a second session ran"
        f" `{hs['snapshot']}` and held it {hs['hold_s']:g} s. Items/s in the last"
        f" {hs['end_s']:g} s of the hold: {items['end']:,} against {items['baseline']:,} before"
        f" ({items['ratio']}x, target {items['target']}); acquire p99 {p99['end']} ms against"
        f" {p99['baseline']} ms ({p99['ratio']}x, target {p99['target']}). Acquire latency:"
        f" {hs['acquire_latency']}.",
        "",
        "| t (s) | snapshot | items/s | enqueued/s | fewest ready | acquires | empty"
        " | acquire p50 ms | acquire p99 ms | " + " | ".join(f"dead {t}" for t in tables) + " |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        + " | ".join("---:" for _ in tables)
        + " |",
    ]
    for w in hs["windows"]:
        lines.append(
            f"| {w['t']:g} | {'held' if w['held'] else '-'} | {w['items_s']:,} | {w['enqueued_s']:,}"
            f" | {w['fewest_ready']:,} | {w['acquires']:,} | {w['empty_acquires']:,}"
            f" | {w['acquire_p50_ms']} | {w['acquire_p99_ms']} | "
            + " | ".join(f"{w['dead'].get(t, 0):,}" for t in tables)
            + " |"
        )
    lines += [
        "",
        "At the release:",
        "",
        "| table | live | dead | MB (pg_total_relation_size) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, t in hs["at_release"]["tables"].items():
        lines.append(f"| {name} | {t['live']:,} | {t['dead']:,} | {t['mb']} |")
    for t in hs["at_release"]["other_tables_most_dead"]:
        lines.append(
            f"| {t['table']} (not in the list) | {t['live']:,} | {t['dead']:,} | {t['mb']} |"
        )
    holder = hs["at_release"].get("holder") or {}
    if holder:
        lines += [
            "",
            f"The holding session at the release: {holder.get('state')}, its snapshot"
            f" {holder.get('xmin_age_xids')} transactions old, open {holder.get('open_s')} s.",
        ]
    return lines
