"""Jobs at scale: a real controller syncing from a real Slurm with a 100,000-job queue, its memory over time.

Issue #22 item 3: "the scheduler sync handles 100,000 queued/running jobs with flat memory". This starts
the Slurm lab (scripts/slurm-lab.sh: slurmctld + 3 slurmd, ``MaxJobCount`` raised), submits ``JOBS``
individual jobs (``sbatch`` in parallel, one job record each: no arrays), each ``sleep 1`` on one CPU,
so the lab's 3 nodes x 2 CPUs keep starting and ending jobs (the churn) while the queue stays ~100,000
deep for hours. Then it starts ``gpufleet controller serve`` (a separate process, scheduler "slurm",
reconciler every second) with the lab's nodes registered, and every ``SAMPLE_S`` seconds for
``MINUTES`` minutes:

* reports a checkpoint for a running job (``POST /v1/jobs/{id}/checkpoint``, as a training job does)
  and reads its events (``GET /v1/jobs/{id}/events``): both look the job up in Slurm;
* samples the controller's RSS (``VmRSS``; ``VmHWM`` is its peak), slurmctld's RSS (for context),
  the reconciler's mean pass time since the last sample (``gpufleet_reconciler_pass_seconds``),
  the time of the per-pass read of the running jobs (``squeue --states=RUNNING``), the queue length,
  Slurm's completed-jobs counter (``sdiag``: the churn) and the load average (the box is shared).

Reported: RSS start/end/max and its slope (least squares, MB per minute) over the whole run and after
the first tenth (warm-up), the pass and lookup times, the submission rate, the churn.

Run: ``python -m bench jobs_scale [--quick]`` (quick: 2,000 jobs, 1 minute). Needs root and Slurm
22.05 (the lab's requirements). Knobs (environment): ``JOBS_SCALE_JOBS``, ``JOBS_SCALE_MINUTES``,
``JOBS_SCALE_SAMPLE_S``, ``JOBS_SCALE_HELD_AFTER=N`` (jobs past the N-th are submitted held: see
``submit_rpc`` in the results); ``JOBS_SCALE_LAB=DIR`` + ``JOBS_SCALE_KEEP_LAB=1`` keep the lab (and its
queue) for the next run, which submits only what is missing; ``JOBS_SCALE_CONTROLLER_SRC=DIR`` runs
the controller from another source tree (e.g. the commit before a fix, for a before/after).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from tests.integration.slurm.lab import SlurmLab, pick_port_base, slurm_installed

REPO = Path(__file__).resolve().parents[1]
ADMIN, AGENT = "bench-admin-token", "bench-agent-token"
# defer: a submission does not try to schedule at once (100,000 sbatch calls); the main and backfill
# schedulers look at the head of the queue only, as a large site configures them.
SCHED_PARAMS = "defer,default_queue_depth=100,bf_max_job_test=100,bf_interval=30"


def _env_num(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r}: expected a number") from None
    if value <= 0:
        raise SystemExit(f"{name}={raw!r}: expected a number above 0")
    return value


def _rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x."""
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lab() -> tuple[SlurmLab, bool]:
    """The lab (a kept one when JOBS_SCALE_LAB names a running one) and whether to keep it after."""
    keep = os.environ.get("JOBS_SCALE_KEEP_LAB") == "1"
    named = os.environ.get("JOBS_SCALE_LAB", "")
    root = Path(named) if named else Path(tempfile.mkdtemp(prefix="gpufleet-jobs-scale-"))
    base_file = root / "port_base"
    base = int(base_file.read_text()) if base_file.exists() else pick_port_base()
    lab = SlurmLab(root=root, port_base=base, ghost=False, max_jobs=int(_env_num("JOBS_SCALE_JOBS", 100_000)) + 20_000,
                   sched_params=SCHED_PARAMS)
    root.mkdir(parents=True, exist_ok=True)
    lab.up()
    base_file.write_text(str(base))
    return lab, keep


def _queue(lab: SlurmLab) -> list[str]:
    """The ids of the jobs queued or running."""
    return lab.cmd("squeue", "-h", "-t", "PD,R,CG,CF", "-o", "%i", timeout=120).stdout.split()


def _submit(lab: SlurmLab, jobs: int, held_after: int | None) -> dict[str, Any]:
    """Fill the queue up to ``jobs`` with parallel sbatch loops; the rate is jobs per wall-clock second.
    Past ``held_after`` queued jobs they are submitted held (``-H``): slurmctld's time to accept an
    eligible job grows with the pending queue (``submit_rpc`` in the results), a held one's does not."""
    have = len(_queue(lab))
    need = jobs - have
    if need <= 0:
        return {"already_queued": have, "submitted": 0}
    held = min(need, max(0, jobs - held_after)) if held_after is not None else 0
    out: dict[str, Any] = {"already_queued": have}
    for what, count, flag in (("eligible", need - held, ""), ("held", held, "-H ")):
        if count:
            out[what] = _sbatch_loops(lab, count, flag)
    return out


def _sbatch_loops(lab: SlurmLab, count: int, flag: str, workers: int = 8) -> dict[str, Any]:
    per = [count // workers + (1 if i < count % workers else 0) for i in range(workers)]
    errs = lab.root / "log" / "sbatch.err"
    failures = errs.parent / (errs.name + ".count")
    failures.unlink(missing_ok=True)
    loop = (f"for i in $(seq 1 {{n}}); do sbatch -Q {flag}-p low -J q -n 1 -o /dev/null --wrap 'sleep 1' "
            f">/dev/null 2>>{errs} || echo x >> {failures}; done")
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["bash", "-c", loop.format(n=n)], env=lab.env) for n in per if n]
    for p in procs:
        p.wait()
    took = time.perf_counter() - t0
    failed = len(failures.read_text().splitlines()) if failures.exists() else 0
    return {"submitted": count - failed, "failed": failed, "parallel_sbatch": workers, "seconds": round(took, 1),
            "jobs_per_s": round((count - failed) / took, 1),
            "errors_tail": errs.read_text()[-300:] if failed and errs.exists() else ""}


def _controller(lab: SlurmLab, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cfg = work / "controller.toml"
    cfg.write_text(f"""database_url = "sqlite:///{work / 'controller.db'}"
scheduler = "slurm"
slurm_conf = "{lab.slurm_conf}"
host = "127.0.0.1"
port = {port}
reconcile_interval = 1.0
[[tokens]]
name = "admin"
role = "admin"
token = "{ADMIN}"
[[tokens]]
name = "agent"
role = "agent"
token = "{AGENT}"
nodes = ["*"]
""")
    src = os.environ.get("JOBS_SCALE_CONTROLLER_SRC") or str(REPO / "src")
    env = {**lab.env, "PYTHONPATH": f"{src}{os.pathsep}{REPO}"}
    log = (work / "controller.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet", "controller", "serve", "--config", str(cfg),
                             "--log-level", "WARNING"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/v1/nodes", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"controller did not start: {(work / 'controller.log').read_text()[-2000:]}")
        time.sleep(0.5)
    r = httpx.post(f"{url}/v1/nodes", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30,
                   json={"nodes": [{"id": n, "rack": "r1"} for n in lab.nodes], "state": "ready"})
    r.raise_for_status()
    return proc, url


def _pass_totals(client: httpx.Client) -> tuple[float, float]:
    text = client.get("/metrics").text
    total = re.search(r"^gpufleet_reconciler_pass_seconds_sum (\S+)$", text, re.M)
    count = re.search(r"^gpufleet_reconciler_pass_seconds_count (\S+)$", text, re.M)
    return (float(total.group(1)) if total else 0.0, float(count.group(1)) if count else 0.0)


def _completed(lab: SlurmLab) -> int:
    m = re.search(r"Jobs completed:\s+(\d+)", lab.cmd("sdiag", check=False).stdout)
    return int(m.group(1)) if m else 0


def _sample(lab: SlurmLab, pid: int, ctld: int, admin: httpx.Client, agent: httpx.Client,
            last: tuple[float, float]) -> tuple[dict[str, Any], tuple[float, float]]:
    t0 = time.perf_counter()
    running = lab.cmd("squeue", "--noheader", "--states=RUNNING", "--format=%A|%N", timeout=120).stdout.split()
    read_s = time.perf_counter() - t0
    queue = _queue(lab)
    # a running job's report, as a training job sends it; between the scheduler's waves no job runs and a
    # queued one's lookup is the same read (the answer is then 403: it runs on no node of the token's)
    job = running[0].split("|")[0] if running else (queue[-1] if queue else "")
    ckpt_s = events_s = None
    ckpt_code = events_code = 0
    if job:
        t0 = time.perf_counter()
        r = agent.post(f"/v1/jobs/{job}/checkpoint", json={"time": datetime.now(UTC).isoformat()})
        ckpt_s, ckpt_code = time.perf_counter() - t0, r.status_code
        t0 = time.perf_counter()
        events_code = admin.get(f"/v1/jobs/{job}/events").status_code
        events_s = time.perf_counter() - t0
    totals = _pass_totals(admin)
    passes = totals[1] - last[1]
    rss, hwm = _rss_mb(pid)
    return {
        "rss_mb": round(rss, 1), "hwm_mb": round(hwm, 1), "slurmctld_rss_mb": round(_rss_mb(ctld)[0], 1),
        "pass_mean_s": round((totals[0] - last[0]) / passes, 3) if passes else None, "passes": int(passes),
        "running_read_s": round(read_s, 3), "running": len(running),
        "checkpoint_report_s": round(ckpt_s, 3) if ckpt_s is not None else None, "checkpoint_code": ckpt_code,
        "job_events_s": round(events_s, 3) if events_s is not None else None, "events_code": events_code,
        "queued": len(queue), "completed_total": _completed(lab),
        "load1": float(Path("/proc/loadavg").read_text().split()[0]),
    }, totals


def run(quick: bool = False) -> dict[str, Any]:
    if not slurm_installed():
        return {"skipped": "needs root and Slurm 22.05 (slurmctld, slurmd, munged, sbatch): see scripts/slurm-lab.sh"}
    jobs = int(_env_num("JOBS_SCALE_JOBS", 2_000 if quick else 100_000))
    minutes = _env_num("JOBS_SCALE_MINUTES", 1 if quick else 30)
    every = _env_num("JOBS_SCALE_SAMPLE_S", 5 if quick else 10)
    os.environ.setdefault("JOBS_SCALE_JOBS", str(jobs))
    lab, keep = _lab()
    work = Path(tempfile.mkdtemp(prefix="gpufleet-jobs-scale-ctl-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        held_after = os.environ.get("JOBS_SCALE_HELD_AFTER", "")
        submission = _submit(lab, jobs, int(_env_num("JOBS_SCALE_HELD_AFTER", 0)) if held_after else None)
        print(f"jobs_scale: queue filled: {submission}", flush=True)
        proc, url = _controller(lab, work)
        ctld = int((lab.root / "run" / "slurmctld.pid").read_text())
        admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=300)
        agent = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {AGENT}"}, timeout=300)
        samples: list[dict[str, Any]] = []
        totals = _pass_totals(admin)
        start = time.monotonic()
        end = start + minutes * 60
        while True:
            row, totals = _sample(lab, proc.pid, ctld, admin, agent, totals)
            row["t_s"] = round(time.monotonic() - start, 1)
            samples.append(row)
            print(f"jobs_scale: {row}", flush=True)
            if proc.poll() is not None:
                raise RuntimeError(f"the controller exited: {(work / 'controller.log').read_text()[-2000:]}")
            if time.monotonic() >= end:
                break
            time.sleep(max(0.0, min(every, end - time.monotonic())))
        admin.close()
        agent.close()
        out = _summary(jobs, minutes, submission, samples, work)
        out["submit_rpc"] = submit_rpc_times(lab.root / "log" / "slurmctld.log")
        return out
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not keep:
            lab.down()
        shutil.rmtree(work, ignore_errors=True)


def submit_rpc_times(slurmctld_log: Path, per: int = 10_000) -> list[dict[str, Any]]:
    """slurmctld's own time per job submission (``_slurm_rpc_submit_batch_job ... usec=``), by ranges of
    ``per`` job ids: how the cost of a submission grows with the queue."""
    line = re.compile(r"^\[(\S+)\] _slurm_rpc_submit_batch_job: JobId=(\d+) .*usec=(\d+)")
    rows = [(datetime.fromisoformat(m.group(1)), int(m.group(2)), int(m.group(3)))
            for m in map(line.match, slurmctld_log.read_text(errors="replace").splitlines()) if m]
    out = []
    for lo in range(0, max((r[1] for r in rows), default=0), per):
        seg = [r for r in rows if lo < r[1] <= lo + per]
        if len(seg) < 2:
            continue
        usec = sorted(r[2] for r in seg)
        span = (seg[-1][0] - seg[0][0]).total_seconds()
        out.append({"job_ids": f"{lo + 1}-{lo + per}", "submissions": len(seg),
                    "median_ms": round(statistics.median(usec) / 1000, 2),
                    "p90_ms": round(usec[int(len(usec) * 0.9)] / 1000, 2),
                    "per_s": round(len(seg) / span, 1) if span else None})
    return out


def _summary(jobs: int, minutes: float, submission: dict[str, Any], samples: list[dict[str, Any]],
             work: Path) -> dict[str, Any]:
    rss = [(s["t_s"] / 60, s["rss_mb"]) for s in samples]
    slopes = [_slope(rss), _slope([p for p in rss if p[0] >= minutes / 10]),
              _slope([p for p in rss if p[0] >= minutes / 2])]
    slope_all, slope_warm, slope_half = (round(x, 3) if x is not None else None for x in slopes)
    passes = [s["pass_mean_s"] for s in samples if s["pass_mean_s"] is not None]
    reads = [s["running_read_s"] for s in samples]
    ckpts = [s["checkpoint_report_s"] for s in samples if s["checkpoint_report_s"] is not None]
    done = samples[-1]["completed_total"] - samples[0]["completed_total"]
    span = samples[-1]["t_s"] - samples[0]["t_s"]
    return {
        "jobs": jobs, "minutes": minutes, "controller_src": os.environ.get("JOBS_SCALE_CONTROLLER_SRC") or "this tree",
        "submission": submission,
        "queued": {"min": min(s["queued"] for s in samples), "max": max(s["queued"] for s in samples)},
        "churn_jobs_per_s": round(done / span, 2) if span else None,
        "controller_rss_mb": {"start": rss[0][1], "end": rss[-1][1], "min": min(r for _, r in rss),
                              "max": max(r for _, r in rss), "peak_hwm": samples[-1]["hwm_mb"],
                              "slope_mb_per_min": slope_all, "slope_after_warmup_mb_per_min": slope_warm,
                              "slope_second_half_mb_per_min": slope_half},
        "slurmctld_rss_mb": {"start": samples[0]["slurmctld_rss_mb"], "end": samples[-1]["slurmctld_rss_mb"]},
        "reconciler_pass_s": {"mean": round(statistics.fmean(passes), 3) if passes else None,
                              "max": max(passes, default=None)},
        "running_read_s": {"mean": round(statistics.fmean(reads), 3), "max": max(reads)},
        "checkpoint_report_s": {"mean": round(statistics.fmean(ckpts), 3) if ckpts else None,
                                "max": max(ckpts, default=None),
                                "codes": sorted({s["checkpoint_code"] for s in samples})},
        "load1": {"mean": round(statistics.fmean(s["load1"] for s in samples), 2),
                  "max": max(s["load1"] for s in samples)},
        "controller_log_tail": (work / "controller.log").read_text()[-500:],
        "samples": compact(samples),
    }


KEPT = ("t_s", "rss_mb", "slurmctld_rss_mb", "pass_mean_s", "checkpoint_report_s", "running_read_s", "queued",
        "load1")


def compact(samples: list[dict[str, Any]], rows: int = 31) -> dict[str, list[Any]]:
    """About ``rows`` evenly spaced samples (first and last included), column by column: the results file
    stays small (every sample is printed while the benchmark runs)."""
    step = max(1, (len(samples) - 1) // (rows - 1))
    picked = samples[::step]
    if picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    return {k: [s[k] for s in picked] for k in KEPT}
