"""The control plane of topics: each topic's controller (the only writer of its layout)
and the parts it is built from (its segment fleet, maintenance, subscriptions, stats,
tiering), the subscription coordinators, and the DAG watch that pushes layouts to
clients."""
