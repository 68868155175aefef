"""Segments and the processes that serve them: a segment (``actor``), how it takes
appends (``appender``), the server side of its data plane (``data_plane``), the host
actor that serves many segments in one process (``host``), the handle callers hold
(``handle``), the directory of which host serves which segment (``directory``), and how
callers find a served segment (``lookup``)."""
