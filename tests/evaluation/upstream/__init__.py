"""Upstream code kept verbatim as the references of the metric tests (each module says its source and licence)."""
