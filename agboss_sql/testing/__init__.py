"""Proving a store set: the conformance suite, the interleaving explorer, the fault suite."""

from __future__ import annotations
