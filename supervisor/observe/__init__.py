"""What the daemon sees and shows: its metrics, the server's load and health, events, logs.

Holds the daemon's Prometheus metrics (``metrics``, read from the engine's frozen view), the
server's own load figures (``telemetry``), readiness and liveness probes (``health``), the
in-process event bus behind ``GET /events`` (``events``), the server's log files
(``serverlogs``), one log line per operation (``oplog``) and the measured effect of a
change (``effect``).
May import: the shared vocabulary (top level), ``host.gpu`` (GPU samples); ``metrics``
reads ``engine``'s view (type-only import). The engine imports this package, never the
other way round at run time.
"""
