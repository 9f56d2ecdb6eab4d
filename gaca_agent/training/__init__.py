"""``gaca-train``'s loop: collect, estimate, update, sync the server, log, evaluate and
checkpoint."""
