package io.raytopics.spark;

/**
 * What makes a task's write idempotent: the cluster stores each chunk of a key once
 * (the chunk's place in the task's rows completes it, {@link StreamSink}).
 */
record WriteKey(String queryId, long batchId, int partitionId) {}
