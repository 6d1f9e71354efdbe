"""Traces of runs for OpenTelemetry backends: what a run did, as spans, from the journal.

The journal is the one source: a run's spans are computed from its events and rows (`journal_spans`), with ids
derived from the run's ids (`context`), so the driver that finishes a run, a worker on another host, a resumed
run and `akm trace export` long after all name the same spans. Exporting (`akm.dispatch.otlp_export`) happens
only when tracing is configured (`settings`): the OpenTelemetry SDK is imported then and never otherwise.
"""
