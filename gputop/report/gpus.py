"""The GPUs' part of ``gputop report`` in words: a headline per GPU over the recording, and what needs a second line.

``gputop.model.gpu_summary`` makes the figures (the report's JSON ``gpus``); this says them.
"""

from __future__ import annotations

from typing import Any

GIB = float(1 << 30)


def _num(value: float | None, fmt: str, unit: str = "") -> str:
    return "N/A" if value is None else f"{value:{fmt}}{unit}"


RECORDER_MACHINE = "this machine (the recorder's)"


def format_gpu_summary_text(summary: dict[str, Any]) -> list[str]:
    """Lines for the text report: one headline per GPU, then what needs a second line."""
    if not summary.get("gpus"):
        return [f"GPUs: no data ({summary.get('unavailable') or 'no GPU samples were recorded'})"]
    driver = f", driver {summary['driver_version']}" if summary.get("driver_version") else ""
    lines = [f"GPUs ({summary['samples']} samples{driver})"]
    several_hosts = any(g.get("hostname") for g in summary["gpus"])
    host = None
    for g in summary["gpus"]:
        if several_hosts and g.get("hostname", "") != host:
            host = g.get("hostname", "")
            lines.append(f" {host or RECORDER_MACHINE}:")
        label = f"GPU {g['index']}" + (" MIG" if g["mig_parent_uuid"] else "")
        mem_total = "?" if g["mem_total_bytes"] is None else f"{g['mem_total_bytes'] / GIB:.1f}"
        mem_peak = None if g["mem_peak_bytes"] is None else g["mem_peak_bytes"] / GIB
        limit = "" if g["power_limit_w"] is None else f" of {g['power_limit_w']:.0f} W"
        ranks = ", ".join(f"{r['run_id']} r{r['rank']}" for r in g["ranks"]) or "none"
        lines.append(
            f"  {label:<9} {g['name']}  util {_num(g['util_mean_pct'], '.0f', '%')} mean"
            f" / {_num(g['util_max_pct'], '.0f', '%')} max"
            f"  mem peak {_num(mem_peak, '.1f')} / {mem_total} GiB"
            f"  power {_num(g['power_mean_w'], '.0f', ' W')} mean / {_num(g['power_max_w'], '.0f', ' W')} max{limit}"
            f"  ranks: {ranks}"
        )
        if g["sm_active_mean_pct"] is not None or g["tensor_active_mean_pct"] is not None:
            lines.append(
                f"            GPM: SM active {_num(g['sm_active_mean_pct'], '.0f', '%')},"
                f" tensor active {_num(g['tensor_active_mean_pct'], '.0f', '%')} (means)"
            )
        links = g.get("link_mean_bytes_s", {})
        for label, link in (("NVLink", "nvlink"), ("PCIe", "pcie")):
            if f"{link}_rx" in links:
                peak = g["link_max_bytes_s"]
                lines.append(
                    f"            {label}: rx {_gbs(links[f'{link}_rx'])} mean / {_gbs(peak[f'{link}_rx'])} max,"
                    f" tx {_gbs(links.get(f'{link}_tx'))} mean / {_gbs(peak.get(f'{link}_tx'))} max"
                )
        if g.get("mem_reserved_bytes"):
            lines.append(
                f"            driver-reserved memory: {g['mem_reserved_bytes'] / GIB:.2f} GiB (not in mem peak)"
            )
        if g.get("pids_from_other_namespace"):
            pids = ", ".join(str(p) for p in g["pids_from_other_namespace"])
            lines.append(f"            NVML reports PIDs from another namespace ({pids}): taken as its ranks'")
        throttled = {r: pct for r, pct in g["throttle_share_pct"].items() if r != "idle"}
        if throttled:
            shares = ", ".join(f"{r} {pct:.0f}%" for r, pct in throttled.items())
            lines.append(f"            clocks held back: {shares} of samples")
        if g["ecc_errors"]:
            lines.append(f"            uncorrected ECC errors: {g['ecc_errors']}")
        for proc in g["unobserved"]:
            used = "" if proc["max_used_bytes"] is None else f", {proc['max_used_bytes'] / GIB:.1f} GiB"
            lines.append(f"            not a rank: pid {proc['pid']} ({proc['name'] or 'unknown'}{used})")
        # GPM fields are N/A on every pre-Hopper GPU: saying so on each line is noise.
        na = {k: v for k, v in g["na"].items() if k not in ("sm_active_pct", "tensor_active_pct")}
        if na:
            lines.append("            N/A: " + "; ".join(f"{k}: {v}" for k, v in sorted(na.items())))
    return lines


def _gbs(rate: float | None) -> str:
    """Bytes per second as GB/s, the unit NVLink and PCIe are quoted in."""
    return "N/A" if rate is None else f"{rate / 1e9:.2f} GB/s"
