"""inert: proves that the WASI imports a Python plugin brings have zero
authority. Each call tries to open a file, list a directory, connect a TCP
socket, resolve a name and read the environment, and reports each attempt
as a Normal Event: ``denied: <error>`` when it failed, ``GRANTED: <what it
got>`` when it succeeded.

Its subject is the WASI imports componentize-py links, not the WIT
world: it is built like every Python plugin, with the SDK, so it is a
``wasmwatch:plugin/plugin@0.4.0`` component (the Rust inert stays on
0.2.0). host/runtime/tests/inert.rs runs it beside the Rust and JS ones.

Config (JSON), both optional: ``{"connect": "HOST:PORT", "resolve": "NAME"}``
(defaults ``127.0.0.1:9`` and ``localhost``).
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  socket's name encoding, imported lazily otherwise (and then missing)
import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import Callable, List

from wasmwatch_plugin import Action, ChangeEvent, Plugin, action, host, parse_config


@dataclass
class Config:
    connect: str = "127.0.0.1:9"
    resolve: str = "localhost"


def _open_file() -> str:
    with open("/etc/passwd") as f:
        return f"read {len(f.read())} characters of /etc/passwd"


def _list_dir() -> str:
    return f"/ holds {os.listdir('/')}"


def _connect(target: str) -> Callable[[], str]:
    def attempt() -> str:
        address, _, port = target.rpartition(":")
        address = address.strip("[]")
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:  # a name: resolved, then connected
            with socket.create_connection((address, int(port)), timeout=1) as s:
                return f"connected to {s.getpeername()}"
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(1)
            s.connect((str(ip), int(port)))
            return f"connected to {s.getpeername()}"

    return attempt


def _resolve(name: str) -> Callable[[], str]:
    def attempt() -> str:
        found = socket.getaddrinfo(name, None)
        return f"{name} is {sorted({a[4][0] for a in found})}"

    return attempt


def _environment() -> str:
    env = dict(os.environ)
    if not env:
        raise LookupError("no environment variables")
    return f"{len(env)} variables: {sorted(env)}"


def _try(reason: str, attempt: Callable[[], str]) -> Action:
    try:
        got = attempt()
    except BaseException as e:  # every failure is a denial, whatever its type
        return action.event_normal(reason, f"denied: {type(e).__name__}: {e}")
    return action.event_normal(reason, f"GRANTED: {got}")


class WitWorld(Plugin):
    def check_config(self, config: str) -> None:
        parse_config("inert", config, Config)

    def handle(self, event: ChangeEvent) -> List[Action]:
        cfg = parse_config("inert", host.config(), Config)
        return [
            _try("OpenFile", _open_file),
            _try("ListDir", _list_dir),
            _try("Connect", _connect(cfg.connect)),
            _try("Resolve", _resolve(cfg.resolve)),
            _try("Environment", _environment),
        ]
