"""The controller service: store, reconciler, API."""
