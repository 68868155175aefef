"""The admin service: every Admin API operation carried out inside the cluster
(``service``), how callers reach it (``caller``), the authentication policy as
operators manage it (``auth``), and the data-pipeline operations Spark's sources and
sinks call (``stream_service``, ``stream_reads``, ``stream_writes``)."""
