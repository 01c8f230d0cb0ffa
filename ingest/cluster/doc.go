// Package cluster runs one node's share of a telemetryd cluster
// (deploy/CLUSTER.md): it consumes the partitions the leases give this
// node, publishes the ones it has caught up on, applies the days dropped
// cluster-wide and drops a day on every node.
//
// Node is the reconcile loop. Every FollowEvery, and whenever the view
// of the leases changes, Step compares the partitions Members wants this
// node to consume with the consumers it runs:
//
//   - a wanted partition without a consumer gets one (Consumers.Start);
//   - a consumer of a partition no longer wanted is stopped and its
//     durable consumer deleted (Consumers.Remove); Members keeps a
//     partition wanted until its new owners have caught up, so a
//     hand-over never leaves fewer answering copies than before;
//   - a consumer that has settled everything the stream held when it
//     started is caught up (Consumer.Backlog) and published as ready:
//     only then do queries come to this node for its partition;
//   - a caught-up partition whose consumer trails the stream by more
//     than MaxReadLag (the messages the stream held at some moment
//     not all settled since, or the server not answering for that
//     long) is published as trailing, and withdrawn from the published
//     ones once another owner answers it without trailing (or this
//     node's lease lapsed), until it is back within the bound: a node
//     does not answer from a copy missing readings the stream acked
//     long before while a fresher copy answers. When every owner
//     trails at once (a NATS server's loss holds up all their
//     consumers), they keep answering what they have rather than
//     leave the partition without an answer;
//   - Serves says, from this state and at once, whether the node
//     answers reads of a partition now: the other nodes' view of the
//     leases trails a hand-over or a withdrawal by up to a refresh, and
//     the node refuses the reads they still send it meanwhile;
//   - the days dropped cluster-wide that this node still holds are
//     dropped (see Node.DropTable for the protocol).
//
// No lock is held across a call to the network or the store: /readyz
// (Ready), the cluster's status and shutdown never wait for a slow
// NATS server.
//
// With a stream per partition (ingest.Config.PartitionStreams) each
// partition consumer reads its partition's own stream; Balancer
// (leaders.go) spreads those streams' leaders over the NATS servers,
// and OldStream (upgrade.go) retires the one stream of the earlier
// layout once every owner has drained its partitions from it.
//
// The edges are small interfaces declared here (Members, Consumers,
// Consumer, Store), met by ingest/ownership, the ingester and the store;
// the clock is a parameter. Tombstones and Positions adapt the store to
// a partition consumer.
package cluster
