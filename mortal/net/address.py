"""Whether a host name or address reaches this machine only: the rule behind the token requirement.

Its own module, with no imports from the project, so that both the config check (``mortal.config``) and the
server's bind check (``mortal.net.param_server``) use the one rule.
"""

import ipaddress
import socket


def is_loopback(host: str, *, resolve: bool = True) -> bool:
    """True when ``host`` reaches this machine only (127.0.0.0/8, ::1), so a peer needs no token.

    ``resolve``: look the name up and require every address it resolves to be loopback (binding a server);
    with False only ``localhost`` and loopback address literals count, without a lookup (a config check,
    where the name may resolve differently later or elsewhere). The wildcard addresses are never loopback.
    """
    if host in ('', '0.0.0.0', '::'):
        return False
    if not resolve and host == 'localhost':
        return True
    try:
        addresses = [info[4][0] for info in socket.getaddrinfo(host, None)] if resolve else [host]
        return all(ipaddress.ip_address(a.split('%')[0]).is_loopback for a in addresses)
    except (socket.gaierror, ValueError):  # unknown name, or (resolve=False) not an address literal
        return False
