"""One segment of a topic: its actor (``actor``), how it takes appends (``appender``),
the server side of its data plane (``data_plane``), and how callers find its running
actor (``lookup``)."""
