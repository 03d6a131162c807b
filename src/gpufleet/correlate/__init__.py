"""Root-cause engine over the topology and the event stream (pure; imports only the domain).

Public API (docs/correlate.md):

* :class:`gpufleet.correlate.engine.Engine` — ``observe(FileEvent)``, ``observe_health_event(HealthEvent)``
  (both return new/changed/cleared :class:`~gpufleet.correlate.model.Verdict` s), ``suspects(now)``,
  ``emitted()``;
* :mod:`gpufleet.correlate.model` — ``Suspect``, ``Verdict``, ``VerdictStatus``, ``SuspectAction``,
  ``Basis`` (how a suspect was reached; its JSON key stays ``finding``), ``verdicts_json``;
* :mod:`gpufleet.correlate.scenarios` / :mod:`gpufleet.correlate.scoring` — the evaluation harness.
"""
