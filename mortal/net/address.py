"""Whether a host reaches this machine only: the rule behind the token requirement (no project imports, so the
config check and the server's bind check share it)."""

import ipaddress
import socket


def is_loopback(host: str, *, resolve: bool = True) -> bool:
    """True when ``host`` reaches this machine only (127.0.0.0/8, ::1), so a peer needs no token.

    ``resolve``: every address the name resolves to must be loopback (binding); False: only ``localhost`` and loopback
    literals count, without a lookup (config check). Wildcard addresses are never loopback."""
    if host in ('', '0.0.0.0', '::'):
        return False
    if not resolve and host == 'localhost':
        return True
    try:
        addresses = [info[4][0] for info in socket.getaddrinfo(host, None)] if resolve else [host]
        return all(ipaddress.ip_address(a.split('%')[0]).is_loopback for a in addresses)
    except (socket.gaierror, ValueError):  # unknown name, or (resolve=False) not an address literal
        return False
