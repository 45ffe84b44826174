"""`python -m dashboards.serve [storage.url=...] [storage.password_env=NAME] [host=127.0.0.1] [port=8080] [allow_remote=false]`

optuna-dashboard on the study storage (the same URL resolution as the driver: `storage.url`, else
$TRM_SWEEPS_STORAGE, else the laptop's SQLite file `outputs/optuna.db`).

optuna-dashboard's HTTP API has no authentication, and it can delete studies and trials. So it binds to the
loopback interface by default; any other address needs `allow_remote=true` (prefer an ssh tunnel:
`ssh -L 8080:127.0.0.1:8080 HOST`).
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from storage import redact
from storage.cli import ArgumentError, parse_args, parse_bool, run_cli, storage_from_args

KNOWN = {
    "storage.url": None,
    "storage.password_env": None,
    "host": "127.0.0.1",
    "port": "8080",
    "allow_remote": "false",
}
REMOTE_WARNING = (
    "warning: optuna-dashboard is reachable from other machines at {where}: its API has no authentication and "
    "anyone who can reach it can read, change and delete studies. Keep it behind a firewall or an "
    "authenticating proxy, or use an ssh tunnel to a loopback-bound dashboard instead."
)


def is_loopback(host: str) -> bool:
    """True when every address `host` stands for is a loopback address (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if host == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def check_bind(host: str, allow_remote: bool) -> str | None:
    """None if binding to `host` is allowed; else the error message (naming the key that allows it)."""
    if is_loopback(host) or allow_remote:
        return None
    return (
        f"host={host!r} is not a loopback address, and optuna-dashboard's API has no authentication (anyone who "
        f"can reach it can delete studies). Bind to 127.0.0.1 and use an ssh tunnel, or pass allow_remote=true "
        f"to serve on {host!r} anyway."
    )


class _Server(WSGIServer):
    def __init__(self, address: tuple[str, int], handler: type[WSGIRequestHandler], **kwargs: Any) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler, **kwargs)


class _Handler(WSGIRequestHandler):
    def log_message(
        self, format: str, *args: Any
    ) -> None:  # one line per request, to stderr (not the default's stdout mix)
        sys.stderr.write(f"{self.address_string()} {format % args}\n")


def main(argv: list[str] | None = None) -> int:
    return run_cli(serve, argv)


def serve(argv: list[str]) -> int:
    args = parse_args(argv, KNOWN, (__doc__ or "").strip())
    allow_remote = parse_bool("allow_remote", args["allow_remote"])
    try:
        port = int(args["port"])
    except ValueError:
        raise ArgumentError(f"port={args['port']!r}: expected an integer 0-65535") from None
    if not 0 <= port <= 65535:
        raise ArgumentError(f"port={port}: expected an integer 0-65535")
    host = args["host"]
    refusal = check_bind(host, allow_remote)
    if refusal:
        raise ArgumentError(refusal)
    url, storage = storage_from_args(args)

    from optuna_dashboard import wsgi

    try:
        server = make_server(host, port, wsgi(storage), server_class=_Server, handler_class=_Handler)
    except OSError as err:
        raise ArgumentError(f"cannot listen on host={host!r} port={port}: {err}") from None
    shown_host = f"[{host}]" if ":" in host else host
    where = f"http://{shown_host}:{server.server_port}/"
    if not is_loopback(host):
        print(REMOTE_WARNING.format(where=where), file=sys.stderr, flush=True)
    print(f"optuna-dashboard for {redact(url)} at {where} (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
