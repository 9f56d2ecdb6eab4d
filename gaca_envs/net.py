"""What every local server of the project (the WebShop site, ``gaca-serve``,
``gaca-env-serve``) decides the same way: which addresses are loopback, how a host
appears in a URL, and whether a request carries the bearer token."""

from __future__ import annotations

import hmac
import ipaddress
import random
import socket
import sys


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (127.0.0.0/8 or ::1);
    IPv6 literals (``::1``, ``[::1]``) and names that resolve to IPv6 count too."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    addresses = {info[4][0].split("%")[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def url_host(host: str) -> str:
    """``host`` as it appears in a URL (IPv6 literals in brackets)."""
    host = host.strip("[]")
    return f"[{host}]" if ":" in host else host


def bearer_ok(authorization: str, token: str | None) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` (constant-time);
    always True when no token is set."""
    if not token:
        return True
    return hmac.compare_digest(authorization.encode(), f"Bearer {token}".encode())


class QuietHangUps:
    """A mixin for a ``socketserver`` server (before the server class in the bases): a
    client that hung up mid-request (a reset or a broken pipe: a trainer's timeout, a
    closed browser tab) is not an error worth a traceback in the server's log; any other
    error still prints one."""

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Linux's default range of the ports the kernel hands out for a bind to port 0.
EPHEMERAL = (32768, 60999)


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel picks from for a bind to port 0 (Linux's setting, else its
    default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = f.read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return EPHEMERAL


def rendezvous_port(draw=random.randrange) -> int:
    """A port for a rendezvous that other processes connect to after it is chosen
    (torch's store: ``MASTER_PORT``, a weight-broadcast group), free on every address now
    and drawn below the kernel's port-0 range: a server that another process starts on
    port 0 meanwhile (Ray starts several) cannot take it before the store binds it, as it
    can a :func:`free_port` port (a rank then reached an HTTP server at the master port).
    Falls back to :func:`free_port` when the range leaves no room below it."""
    low = ephemeral_range()[0]
    if low <= 11_000:
        return free_port()
    for _ in range(64):
        port = draw(10_000, low)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return port
    return free_port()


def port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (in use, no such address), or None."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            sock.bind((host, port))
    except OSError as err:
        return err.strerror or str(err)
    return None
