"""One segment of a topic: its actor (``actor``), how it takes appends (``appender``)
and the server side of its data plane (``data_plane``)."""
