"""The API layer (installed as ``sglang_supervisor_api``): the FastAPI app, its routes, auth,
the audit log, the status page, the daemon's life (signals, reload, the socket), and the
command line in ``cli``.

May import the core (``sglang_supervisor``); the core never imports this package.
"""
