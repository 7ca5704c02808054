"""Every benchmark, one table: ``python -m benchmarks``.

Run from the repository root::

    .venv/bin/python -m benchmarks --eval-dir ../shared/eval --json bench.json
    .venv/bin/python -m benchmarks --quick               # small sizes: checks the plumbing
    .venv/bin/python -m benchmarks --only hot_path,recall

Each benchmark module of this folder (``bench_tokens``, ``bench_compression``,
``bench_hot_path``, ``bench_long_memory``, ``bench_ingest``, ``bench_recall``,
``bench_complete``, and ``bench_load`` when it exists) runs in a process of its own,
``python -m benchmarks.<module> ... --json <file>``, so that one benchmark's threads,
caches and memory (a 100k-vector Chroma store, a loaded model) never skew the next
one's timings. Its own table and
progress go to a log file; its JSON is read back and summarised in one table:
metric, ours, peer, the peer's figure, ratio (how many times better ours is), target
and pass/miss. ``--json`` writes that summary together with every module's full
results.

``--quick`` runs the smallest sizes each module accepts (no MySQL unless
``--mysql-url`` is given, a 1,000-memory store, one LoCoMo conversation cut to three
sessions, one LongMemEval haystack cut to two): its figures check the plumbing and
are not the project's results. The
full run takes an hour or more and wants a quiet machine.

A module this runner does not know (a new ``bench_*.py``) is run with ``--json``
(and ``--quick`` / ``--eval-dir`` when its ``--help`` lists them); its rows come
from the ``summary`` list of its JSON: objects with ``metric``, ``ours``, ``peer``,
``peer_figure``, ``ratio``, ``target`` and ``passed`` (true, false or null).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ORDER = (
    "bench_tokens",
    "bench_compression",
    "bench_hot_path",
    "bench_long_memory",
    "bench_ingest",
    "bench_recall",
    "bench_complete",
    "bench_load",
    "bench_store",
)
ZEP_MS = (87.0, 155.0)  # Zep's published retrieval p50/p95 (field notes)
MEM0_MS = (148.0, 200.0)  # the Mem0 paper's search p50/p95


@dataclass
class Metric:
    """One line of the summary table."""

    benchmark: str
    metric: str
    ours: str
    peer: str = ""
    peer_figure: str = ""
    ratio: str = ""
    target: str = ""
    passed: bool | None = None
    note: str = ""

    @property
    def verdict(self) -> str:
        if self.note == "error":
            return "error"
        return {True: "pass", False: "miss", None: ""}[self.passed]


def times(ours: float | None, peer: float | None, lower_is_better: bool = True) -> str:
    """How many times better ours is than the peer ("" when not comparable)."""
    if not ours or not peer or ours != ours or peer != peer:  # zero, None or NaN
        return ""
    ratio = peer / ours if lower_is_better else ours / peer
    return f"{ratio:.1f}x" if ratio >= 10 else f"{ratio:.2f}x"


# -- per-module arguments and summaries ------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """How to run one benchmark module and read its JSON."""

    module: str
    args: Callable[[argparse.Namespace, Path], list[str]]
    summarize: Callable[[dict[str, Any]], list[Metric]]


def _tokens_args(opts: argparse.Namespace, work: Path) -> list[str]:
    return ["--eval-dir", str(opts.eval_dir)]


def _tokens_summary(payload: dict[str, Any]) -> list[Metric]:
    out = []
    target = payload.get("target", 0.15)
    for row in payload.get("rows", []):
        ours, peer = row["diff"]["ours"], row["diff"]["chars/4"]
        out.append(
            Metric(
                "bench_tokens",
                f"token estimate vs cl100k_base: {row['sample']}",
                f"{ours * 100:+.1f} %",
                "len(text) / 4",
                f"{peer * 100:+.1f} %",
                times(abs(ours), abs(peer)),
                f"within {target * 100:.0f} %",
                bool(row["ours_within_target"]),
            )
        )
    return out


def _compression_args(opts: argparse.Namespace, work: Path) -> list[str]:
    return ["--turns", "10", "--calls", "5"] if opts.quick else []


def _compression_summary(payload: dict[str, Any]) -> list[Metric]:
    out = []
    a, b = payload.get("part_a"), payload.get("part_b")
    if a:
        last = a["rows"][-1]
        turns = a["turns"]
        # The question call must stay under the compression threshold; the answer call
        # carries this turn's 150k-character result whole, so its bound is force-delete's.
        for call, key, without, limit in (
            ("question", "max_question_with", "question_without", 60_000),
            (
                "answer (with the 150k-char tool result)",
                "max_answer_with",
                "answer_without",
                100_000,
            ),
        ):
            ours = a[key]
            out.append(
                Metric(
                    "bench_compression",
                    f"prompt tokens of the {call} call, max over {turns} ERP turns",
                    f"{ours:,}",
                    "no compression",
                    f"{last[without]:,} at turn {turns}",
                    times(ours, last[without]),
                    f"<= {limit:,}",
                    ours <= limit,
                )
            )
        first_over = a["first_question_without_over_120k"]
        out.append(
            Metric(
                "bench_compression",
                f"calls over the 120k limit (ContextOverflowError), {turns} turns",
                "never" if not a["overflows"] else f"turns {a['overflows'][:5]}",
                "no compression",
                f"from turn {first_over}" if first_over else "never",
                "",
                "never",
                not a["overflows"],
            )
        )
    if b:
        for row in b["results"]:
            out.append(
                Metric(
                    "bench_compression",
                    f"compress() p50 / p95, {row['mode']} ({b['messages']} messages, "
                    f"{b['tokens']:,} tokens)",
                    f"{row['p50_ms']:.2f} / {row['p95_ms']:.2f} ms",
                    # The target is per turn; "cold" (every text new) is shown for scale.
                    target="" if row["mode"] == "cold" else "p95 <= 20 ms",
                    passed=None if row["mode"] == "cold" else row["p95_ms"] <= 20.0,
                )
            )
    return out


def _hot_path_args(opts: argparse.Namespace, work: Path) -> list[str]:
    args = ["--mysql-url", opts.mysql_url] if opts.mysql_url else []
    if opts.quick:
        args += ["--sizes", "10000", "--turns", "30"]
        if not opts.mysql_url:
            args.append("--skip-mysql")
    return args


def _hot_path_summary(payload: dict[str, Any]) -> list[Metric]:
    groups: dict[tuple[str, str, int], dict[str, dict[str, Any]]] = {}
    for result in payload.get("results", []):
        key = (result["bench"], result["backend"], result["rows"])
        groups.setdefault(key, {})[result["impl"]] = result
    out = []
    for (bench, backend, rows), pair in groups.items():
        ours, peer = pair.get("ours"), pair.get("peer")
        if ours is None:
            continue
        if bench == "hot path":
            metric = f"hot path p50: add a turn + read the window, {backend}, {rows:,} rows"
            peer_name = "SQLChatMessageHistory (reads the whole session)"
        else:
            metric = f"window read p50, one session of {rows:,} messages, {backend}"
            peer_name = "SQLChatMessageHistory"
        out.append(
            Metric(
                "bench_hot_path",
                metric,
                f"{ours['p50_ms']:.2f} ms (p95 {ours['p95_ms']:.2f})",
                peer_name if peer else "",
                f"{peer['p50_ms']:.2f} ms (p95 {peer['p95_ms']:.2f})" if peer else "",
                times(ours["p50_ms"], peer["p50_ms"]) if peer else "",
                re.sub(r"\s*\(got .*\)$", "", ours.get("target") or ""),
                ours.get("passed"),
            )
        )
    for backend, reason in payload.get("skipped", {}).items():
        out.append(Metric("bench_hot_path", f"{backend} backend", f"skipped: {reason}"))
    return out


def _long_memory_args(opts: argparse.Namespace, work: Path) -> list[str]:
    args = ["--eval-dir", str(opts.eval_dir)]
    if opts.quick:
        args += [
            "--sizes",
            "1000",
            "--queries",
            "20",
            "--warmup",
            "5",
            "--scopes",
            "2",
            "--heavy",
            "0",
            "--pool",
            "300",
            "--ingest-turns",
            "60",
            "--ingest-sessions",
            "6",
        ]
    return args


def _verdict(text: str) -> bool | None:
    return {"OK": True, "PASS": True, "MISS": False, "FAIL": False}.get(text.strip().upper())


def _long_memory_summary(payload: dict[str, Any]) -> list[Metric]:
    out = []
    for row in payload.get("rows", []):
        data, measure = row.get("data", {}), row["measure"]
        if measure.startswith("search") and "p50_ms" in data:
            p50, p95 = data["p50_ms"], data["p95_ms"]
            worst = " (one heavy user)" if measure == "search worst case" else ""
            if "dense" in data:
                worst += f", dense {data['dense']}"
            out.append(
                Metric(
                    "bench_long_memory",
                    f"search p50 / p95, {data['size']:,} memories, scope={data['scope']} "
                    f"({data['in_scope']:,} in scope){worst}, {data['archive']} catalog",
                    f"{p50:.1f} / {p95:.1f} ms",
                    "Zep (published); Mem0 paper",
                    f"{ZEP_MS[0]:g} / {ZEP_MS[1]:g} ms; {MEM0_MS[0]:g} / {MEM0_MS[1]:g} ms",
                    times(p50, ZEP_MS[0]),
                    row.get("target", ""),
                    _verdict(row.get("verdict", "")),
                )
            )
        elif measure == "ingest: add_messages write side":
            extra = data["with_p50_ms"] - data["without_p50_ms"]
            out.append(
                Metric(
                    "bench_long_memory",
                    "add_messages p50 cost of queueing extraction",
                    f"+{extra:.2f} ms ({data['with_p50_ms']:.2f} vs {data['without_p50_ms']:.2f})",
                    "Mem0 add() (extracts inline)",
                    "4-20 s per call (mem0#3097)",
                    "",
                    row.get("target", ""),
                    _verdict(row.get("verdict", "")),
                )
            )
        elif measure.startswith("ingest:") and "turns_per_s" in data:
            out.append(
                Metric(
                    "bench_long_memory",
                    f"ingest throughput, {measure.removeprefix('ingest: ')}",
                    f"{data['turns_per_s']:,.1f} turns/s",
                    target=row.get("target", ""),
                    passed=_verdict(row.get("verdict", "")),
                )
            )
        elif measure == "model load":
            out.append(
                Metric(
                    "bench_long_memory",
                    "embedding model load (all-MiniLM-L6-v2, cpu)",
                    f"{data['load_s']:.1f} s; first query {data['first_query_ms']:.0f} ms",
                )
            )
    return out


def _quick_eval(source: Path, target: Path, sessions: int = 3, dialogues: int = 20) -> Path:
    """A small copy of the eval data in the run's temporary folder (never in the repo).

    LoCoMo: the first conversation cut to its first ``sessions`` sessions, with the
    questions whose evidence lies in them; MADial-zh: every memory, the first
    ``dialogues`` dialogues; LongMemEval-S: the first question, its haystack cut to
    its first answer session and the session before it (or after it).
    """
    sample = json.loads((source / "locomo_dev.json").read_text(encoding="utf-8"))[0]
    conversation = {
        key: value
        for key, value in sample["conversation"].items()
        if not re.fullmatch(r"session_\d+(_date_time)?", key) or int(key.split("_")[1]) <= sessions
    }
    allowed = re.compile(rf"D(?:{'|'.join(str(n) for n in range(1, sessions + 1))}):\d+$")
    questions = [
        qa
        for qa in sample["qa"]
        if qa.get("evidence") and all(allowed.match(str(e).strip()) for e in qa["evidence"])
    ]
    target.mkdir(parents=True, exist_ok=True)
    (target / "locomo_dev.json").write_text(
        json.dumps([{**sample, "conversation": conversation, "qa": questions}], ensure_ascii=False),
        encoding="utf-8",
    )
    madial = target / "madial_zh"
    madial.mkdir(exist_ok=True)
    (madial / "memory.jsonl").write_text(
        (source / "madial_zh" / "memory.jsonl").read_text(encoding="utf-8"), encoding="utf-8"
    )
    lines = (source / "madial_zh" / "dialogue_dev.jsonl").read_text(encoding="utf-8").splitlines()
    (madial / "dialogue_dev.jsonl").write_text("\n".join(lines[:dialogues]) + "\n", "utf-8")
    item = json.loads((source / "longmemeval_s_dev.json").read_text(encoding="utf-8"))[0]
    ids = item["haystack_session_ids"]
    answer = next(i for i, sid in enumerate(ids) if sid in item["answer_session_ids"])
    keep = sorted({max(answer - 1, 0), answer, min(answer + 1, len(ids) - 1)})[:2]
    cut = {
        name: [item[name][i] for i in keep]
        for name in ("haystack_session_ids", "haystack_dates", "haystack_sessions")
    }
    (target / "longmemeval_s_dev.json").write_text(
        json.dumps([{**item, **cut}], ensure_ascii=False), encoding="utf-8"
    )
    return target


def _recall_args(opts: argparse.Namespace, work: Path) -> list[str]:
    if opts.quick:
        eval_dir = _quick_eval(opts.eval_dir, work / "eval-quick")
        return ["--eval-dir", str(eval_dir), "--lme", "1"]
    return ["--eval-dir", str(opts.eval_dir)]


RECALL_PEERS = {
    "LoCoMo": "MiniLM + BM25 RRF on raw turns (eval README)",
    "MADial": "char-bigram BM25 (eval README)",
    "LongMemEval": "",
}


def _recall_summary(payload: dict[str, Any]) -> list[Metric]:
    out = []
    for name, row in payload.items():
        if not isinstance(row, dict) or "ours" not in row:
            continue
        peer = (
            next((label for key, label in RECALL_PEERS.items() if name.startswith(key)), "")
            if "baseline" in row
            else ""
        )
        out.append(
            Metric(
                "bench_recall",
                f"{name} ({row['questions']:,} questions)",
                f"{row['ours']:.3f}",
                peer,
                f"{row['baseline']:.2f}" if "baseline" in row else "",
                times(row["ours"], row.get("baseline"), lower_is_better=False),
                f">= {row['target']:.2f}" if "target" in row else "",
                row["ours"] >= row["target"] if "target" in row else None,
            )
        )
    return out


def _complete_args(opts: argparse.Namespace, work: Path) -> list[str]:
    return ["--eval-dir", str(opts.eval_dir), *(["--quick"] if opts.quick else [])]


def _generic_summary(module: str) -> Callable[[dict[str, Any]], list[Metric]]:
    def summarize(payload: dict[str, Any]) -> list[Metric]:
        rows = payload.get("summary")
        if not isinstance(rows, list):
            return [Metric(module, "(no 'summary' list in its JSON: see the full results)", "")]
        return [
            Metric(
                module,
                str(row.get("metric", "")),
                str(row.get("ours", "")),
                str(row.get("peer", "") or ""),
                str(row.get("peer_figure", "") or ""),
                str(row.get("ratio", "") or ""),
                str(row.get("target", "") or ""),
                row.get("passed"),
            )
            for row in rows
            if isinstance(row, dict)
        ]

    return summarize


SPECS = {
    spec.module: spec
    for spec in (
        Spec("bench_tokens", _tokens_args, _tokens_summary),
        Spec("bench_compression", _compression_args, _compression_summary),
        Spec("bench_hot_path", _hot_path_args, _hot_path_summary),
        Spec("bench_long_memory", _long_memory_args, _long_memory_summary),
        Spec("bench_recall", _recall_args, _recall_summary),
        Spec("bench_complete", _complete_args, _generic_summary("bench_complete")),
    )
}


def _module_options(module: str) -> str:
    """The module's ``--help`` text ("" if it cannot even print that)."""
    run = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run.stdout if run.returncode == 0 else ""


def _generic_spec(module: str) -> Spec:
    def args(opts: argparse.Namespace, work: Path) -> list[str]:
        help_text = _module_options(module)
        out = []
        if opts.quick and "--quick" in help_text:
            out.append("--quick")
        if "--eval-dir" in help_text:
            out += ["--eval-dir", str(opts.eval_dir)]
        if opts.mysql_url and "--mysql-url" in help_text:
            out += ["--mysql-url", opts.mysql_url]
        return out

    return Spec(module, args, _generic_summary(module))


def discover(only: Iterable[str] | None = None) -> list[Spec]:
    """The benchmark modules of this folder, in the usual order, unknown ones last."""
    found = sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
    names = [m for m in ORDER if m in found] + [m for m in found if m not in ORDER]
    if only:
        wanted = {name if name.startswith("bench_") else f"bench_{name}" for name in only}
        unknown = wanted - set(names)
        if unknown:
            sys.exit(f"no benchmark module {', '.join(sorted(unknown))} (have: {', '.join(names)})")
        names = [name for name in names if name in wanted]
    return [SPECS.get(name) or _generic_spec(name) for name in names]


# -- running ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one module's run left behind."""

    module: str
    argv: list[str]
    log: str
    status: str = "ok"
    returncode: int | None = None
    seconds: float = 0.0
    results: Any = None
    metrics: list[Metric] = field(default_factory=list)


def run_one(spec: Spec, opts: argparse.Namespace, work: Path, logs: Path) -> Outcome:
    """Run a module in its own process; read its JSON; summarise it."""
    result_path = work / f"{spec.module}.json"
    log_path = logs / f"{spec.module}.log"
    try:
        extra = spec.args(opts, work)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        outcome = Outcome(spec.module, [], str(log_path), status="failed")
        outcome.metrics = [Metric(spec.module, f"could not prepare its arguments: {exc}", "")]
        outcome.metrics[0].note = "error"
        return outcome
    argv = [sys.executable, "-m", f"benchmarks.{spec.module}", *extra, "--json", str(result_path)]
    outcome = Outcome(spec.module, argv[1:], str(log_path))
    print(f"{spec.module}: running ({' '.join(argv[1:])})", flush=True)
    started = time.perf_counter()
    with log_path.open("w", encoding="utf-8") as log:
        if opts.verbose:
            process = subprocess.Popen(
                argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert process.stdout is not None
            for line in process.stdout:
                sys.stdout.write(line)
                log.write(line)
            returncode = process.wait()
        else:
            returncode = subprocess.run(
                argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False
            ).returncode
    outcome.seconds = round(time.perf_counter() - started, 1)
    outcome.returncode = returncode
    if returncode != 0 or not result_path.exists():
        outcome.status = "failed"
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        reason = tail[-1] if tail else f"exit code {returncode}"
        metric = Metric(spec.module, f"did not finish (exit {returncode}): {reason[:160]}", "")
        metric.note = "error"
        outcome.metrics = [metric]
    else:
        outcome.results = json.loads(result_path.read_text(encoding="utf-8"))
        try:
            outcome.metrics = spec.summarize(outcome.results)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            metric = Metric(spec.module, f"its JSON did not have the expected shape: {exc!r}", "")
            metric.note = "error"
            outcome.metrics = [metric]
    print(f"{spec.module}: {outcome.status} in {outcome.seconds:.0f} s (log: {log_path})")
    return outcome


def print_summary(outcomes: list[Outcome], quick: bool) -> None:
    """The one table: metric, ours, peer, peer figure, ratio, target, pass/miss."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    title = "Benchmarks" + (
        " (--quick: small sizes, figures check the plumbing only)" if quick else ""
    )
    table = Table(title=title, title_justify="left", show_lines=False)
    for column in ("metric", "ours", "peer", "peer figure", "ratio", "target", "pass/miss"):
        table.add_column(column, overflow="fold", justify="right" if column == "ratio" else "left")
    styles = {"pass": "green", "miss": "bold red", "error": "bold red"}
    for outcome in outcomes:
        table.add_section()
        table.add_row(Text(f"{outcome.module} ({outcome.seconds:.0f} s)", style="bold"))
        for m in outcome.metrics:
            verdict = m.verdict
            table.add_row(
                Text(m.metric),
                Text(m.ours),
                Text(m.peer),
                Text(m.peer_figure),
                Text(m.ratio),
                Text(m.target),
                Text(verdict, style=styles.get(verdict, "")),
            )
    Console(width=max(160, Console().width)).print(table)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--eval-dir", type=Path, default=Path("../shared/eval"))
    parser.add_argument("--quick", action="store_true", help="smallest sizes: check the plumbing")
    parser.add_argument(
        "--json",
        type=Path,
        default=Path("benchmarks/results/latest.json"),
        help="write the summary and every module's results (default: %(default)s)",
    )
    parser.add_argument("--only", help="comma-separated modules, e.g. hot_path,recall")
    parser.add_argument(
        "--mysql-url",
        default=None,
        help="MySQL for bench_hot_path (default: its own default, skipped with --quick)",
    )
    parser.add_argument("--logs", type=Path, help="folder for each module's output")
    parser.add_argument("--verbose", action="store_true", help="also stream each module's output")
    opts = parser.parse_args(argv)
    opts.eval_dir = opts.eval_dir.resolve()
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    specs = discover(opts.only.split(",") if opts.only else None)
    started_at = datetime.now().astimezone().isoformat(timespec="seconds")
    load_before = os.getloadavg()
    if load_before[0] > (os.cpu_count() or 1) / 2:
        print(f"note: load average {load_before[0]:.1f} on {os.cpu_count()} CPUs; expect noise")
    with tempfile.TemporaryDirectory(prefix="benchmarks-") as folder:
        work = Path(folder)
        if opts.logs is None:  # kept after the run, for the modules' own tables
            opts.logs = (
                opts.json.with_suffix(".logs")
                if opts.json
                else Path(tempfile.mkdtemp(prefix="benchmark-logs-"))
            )
        logs = opts.logs.resolve()
        logs.mkdir(parents=True, exist_ok=True)
        outcomes = [run_one(spec, opts, work, logs) for spec in specs]
    print_summary(outcomes, opts.quick)
    if opts.json:
        payload = {
            "started_at": started_at,
            "finished_at": datetime.now().astimezone().isoformat(timespec="seconds"),
            "quick": opts.quick,
            "argv": sys.argv[1:] if argv is None else argv,
            "machine": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "load_average_before": load_before,
                "load_average_after": os.getloadavg(),
            },
            "summary": [{**asdict(m), "verdict": m.verdict} for o in outcomes for m in o.metrics],
            "benchmarks": {
                o.module: {
                    "status": o.status,
                    "returncode": o.returncode,
                    "seconds": o.seconds,
                    "argv": o.argv,
                    "log": o.log,
                    "results": o.results,
                }
                for o in outcomes
            },
        }
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps(payload, ensure_ascii=False, indent=2), encoding="utf-8")
        print(f"wrote {opts.json}")
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
