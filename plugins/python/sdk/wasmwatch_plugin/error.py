"""The error a plugin returns."""

from __future__ import annotations

from componentize_py_types import Err

PluginError = Err
"""Raise ``PluginError("message")`` from ``check_config`` or ``handle`` to
return an error (the WIT ``result``'s ``err`` case).

The message reaches the operator: from ``check_config`` it fails start-up
(and ``wasmwatch validate``); from ``handle`` it fails this delivery, which
the host retries per the plugin's delivery policy. The message is
``error.value``.

It is componentize-py's own ``Err`` under a clearer name, not a subclass:
componentize-py turns only exactly ``Err`` into an error result. Any other
exception traps the sandbox instead; the host reports that as a failure too,
with the traceback from stderr, which helps while writing a plugin.
"""
