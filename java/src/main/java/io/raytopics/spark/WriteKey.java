package io.raytopics.spark;

import com.fasterxml.jackson.databind.node.ObjectNode;

/** What makes a task's write idempotent at the gateway: the same key is stored once. */
record WriteKey(String queryId, long batchId, int partitionId) {
    /** A write request body for these records, without chunk fields. */
    ObjectNode request() {
        ObjectNode body = Json.MAPPER.createObjectNode();
        body.put("queryId", queryId);
        body.put("batchId", batchId);
        body.put("partitionId", partitionId);
        return body;
    }
}
