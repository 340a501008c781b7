"""What a batch says: a line per model as it finishes, the summary table, and the report file
(JSON, or one HTML page with a section per model)."""
from __future__ import annotations

import json
import os
import tempfile

from .usage import new_file_mode


def line(r: dict) -> str:
    if r["status"] == "kept":
        return f"kept   {r['model']}: {r['reason']}"
    if r["status"] != "optimized":
        return f"FAILED {r['model']}: {r['reason']}"
    lat = f", ORT {r['latency_ms_before']:.3f} -> {r['latency_ms_after']:.3f} ms" if "latency_ms_before" in r else ""
    if "kept_original" in r:
        return f"ok     {r['model']}: kept as it was ({r['kept_original']}){lat}"
    slower = f" ({r['slower']})" if "slower" in r else ""
    return (f"ok     {r['model']}: nodes {r['nodes_before']} -> {r['nodes_after']}, "
            f"{sum(r['rewrites'].values())} rewrites{lat}{slower}")


def status(r: dict) -> str:
    """What became of a model: a model written as it was, measured slower optimized, says so."""
    return "kept original" if "kept_original" in r else r["status"]


def summary(records: list[dict]) -> str:
    head = ("model", "status", "nodes", "rewrites", "curvature", "ORT ms before", "after", "after/before")
    rows = [head]
    for r in records:
        ok = r["status"] == "optimized"
        before, after = r.get("latency_ms_before"), r.get("latency_ms_after")
        rows.append((
            os.path.basename(r["model"]), status(r),
            f"{r['nodes_before']} -> {r['nodes_after']}" if "nodes_before" in r else "-",
            str(sum(r["rewrites"].values())) if "rewrites" in r else "-",
            f"{r['curvature_before']} -> {r['curvature_after']}" if "curvature_before" in r else "-",
            f"{before:.3f}" if ok and before else "-", f"{after:.3f}" if ok and after else "-",
            f"{after / before:.2f}" if ok and before and after else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    kept = sum(r["status"] == "kept" for r in records)
    failed = sum(r["status"] not in ("optimized", "kept") for r in records)
    stopped = sorted({r["profiling_stopped"] for r in records if r.get("profiling_stopped")})
    notes = [f"kernel timing stopped early on {sum('profiling_stopped' in r for r in records)} "
             f"models ({'; '.join(stopped)}): their costs are estimates"] if stopped else []
    counts = f"{len(records) - failed - kept} optimized, {f'{kept} kept, ' if kept else ''}{failed} failed"
    return "\n".join(lines + [counts] + notes)


def html(path: str) -> bool:
    return path.endswith((".html", ".htm"))


def write_report(path: str, records: list[dict], interrupted: bool) -> None:
    """JSON, or one HTML page with a section per model for a path ending in .html."""
    folder = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
        if html(path):
            from .html_report import batch_page
            f.write(batch_page(records, summary(records), interrupted, status))
        else:
            json.dump({"models": records, "interrupted": interrupted}, f, indent=2)
    os.chmod(f.name, new_file_mode())
    os.replace(f.name, path)
