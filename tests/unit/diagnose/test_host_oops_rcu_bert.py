"""Oopses, RCU stalls and BERT records (tests/fixtures/kernel-logs/host-oops-rcu-bert.log, sources in the
manifest): what each finding says beyond kind and severity, and what must not be reported."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.diagnose.decoder import Decoder
from gpufleet.diagnose.events import finding_to_event
from gpufleet.diagnose.finding import Finding
from gpufleet.diagnose.reader import decode_stream, open_log
from gpufleet.domain.catalog import Catalog, load_default_catalog
from gpufleet.domain.events import EventKind, Severity
from tests.unit.diagnose.conftest import FIXTURES

CAT: Catalog = load_default_catalog()


def _found() -> dict[int, Finding]:
    dec = Decoder(CAT, year=2024)
    with open_log(str(FIXTURES / "host-oops-rcu-bert.log")) as fh:
        return {f.line: f for f in decode_stream(fh, dec)}


def test_an_oops_names_the_task_and_the_faulting_module() -> None:
    f = _found()
    x86, arm64, old = f[2], f[19], f[33]
    assert (x86.get("module"), x86.get("function"), x86.get("process")) == ("iavf", "iavf_xmit_frame_ring",
                                                                            "kworker/u64:9")
    assert "Oops: 0002 [#1]" in x86.raw and "dev_hard_start_xmit" in x86.raw  # one finding for the whole report
    assert (arm64.get("function"), arm64.get("module")) == ("may_access_direct_pkt_data", "")
    assert old.get("function") == "page_is_buddy"  # the 4.x "RIP: 0010:[<addr>]  [<addr>] fn+off/len" form
    assert {x86.catalog_kind, arm64.catalog_kind, old.catalog_kind} == {"kernel_oops"}


def test_a_user_process_general_protection_fault_is_not_an_oops() -> None:
    assert 41 not in _found()  # "traps: gsd-wacom[1855] general protection fault ip:..."


def test_rcu_stalls_name_the_stalled_cpus() -> None:
    f = _found()
    assert [(f[n].get("event"), f[n].get("cpus")) for n in (42, 46, 50)] == [
        ("rcu_stall", "3"), ("rcu_stall", "25"), ("rcu_stall", "")]


def test_a_bert_record_is_the_previous_boot_not_a_live_fatal_error() -> None:
    f = _found()
    fatal, corrected = f[51], f[59]
    assert 52 not in f and 61 not in f  # its "[Hardware Error]: event severity:" lines are not GHES findings
    assert (fatal.get("event"), fatal.get("class"), fatal.severity) == ("bert", "fatal", Severity.DEGRADED)
    assert corrected.severity is Severity.INFO
    ev = finding_to_event(fatal, "n1", id="b:51", fallback_time=datetime(2026, 11, 24, tzinfo=UTC))
    assert ev is not None and (ev.kind, ev.attr("event"), ev.severity) == (EventKind.CHECK_FAILED, "bert",
                                                                           Severity.DEGRADED)
    dec = Decoder(CAT)
    (ghes,) = dec.feed("{1}[Hardware Error]: event severity: fatal") + dec.flush()
    assert ghes.severity is Severity.FATAL  # the same words without a BERT header: a live error


def test_oops_and_rcu_stall_are_host_kernel_checks_for_the_controller() -> None:
    dec = Decoder(None)
    for line in ("[ 5973.259566] rcu: INFO: rcu_preempt self-detected stall on CPU",
                 "[  310.103223] BUG: kernel NULL pointer dereference, address: 0000000000000008"):
        (f,) = dec.feed(line) + dec.flush()
        ev = finding_to_event(f, "n1", id="x", fallback_time=datetime(2026, 11, 24, tzinfo=UTC))
        assert ev is not None and (ev.kind, ev.attr("check"), ev.severity) == (
            EventKind.CHECK_FAILED, "host_kernel", Severity.DEGRADED)
